"""The decoding parameters' table drives the checkpoint reader, the GGUF keys, the CLI and `/set`."""

from __future__ import annotations

import dataclasses
import io
import json
import shutil
from pathlib import Path

import pytest
from clover_convert.metadata import add_diffusion_keys
from gguf import GGUFWriter
from rich.console import Console
from typer.testing import CliRunner

from clover_local.api import defaults_from_gguf
from clover_local.chat import SETTABLE, ChatSession
from clover_local.cli import app
from clover_local.model import gguf_names as gn
from clover_local.model.config import CheckpointConfig, GenerationDefaults
from clover_local.model.decoding_parameters import PARAMETERS, from_request
from clover_local.model.gguf_info import read_info
from clover_local.model.json_fields import ConfigError
from clover_local.policy import DecodingSettings

# a value per parameter that differs from its default, of its type, within its range (hparam_limits)
CHANGED = {p.name: p.type(p.default * 0.5 + 0.01) for p in PARAMETERS}


def test_every_parameter_round_trips_through_a_gguf(tiny_checkpoint, tmp_path):
    ck = CheckpointConfig.from_dir(tiny_checkpoint)
    gen = GenerationDefaults.from_dict({**CHANGED, "eos_token_id": [7, 9]})
    ck = dataclasses.replace(
        ck, model=ck.model.with_overrides(block_size=CHANGED["block_size"]), generation=gen
    )
    path = tmp_path / "keys.gguf"
    w = GGUFWriter(path, gn.ARCH)
    add_diffusion_keys(w, ck)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    back = defaults_from_gguf(read_info(path), eos_fallback=[])
    assert {p.name: getattr(back, p.name) for p in PARAMETERS} == CHANGED
    assert back.eos_token_ids == (7, 9)


def test_settings_take_every_parameter_from_the_defaults_and_the_request():
    gen = GenerationDefaults.from_dict(CHANGED)
    s = DecodingSettings.from_defaults(gen, mask_token_id=5)
    assert {p.name: getattr(s, p.name) for p in PARAMETERS} == CHANGED
    request = {p.request: p.type(p.default) for p in PARAMETERS if p.request}
    s = DecodingSettings.from_defaults(gen, mask_token_id=5, **from_request(request))
    assert all(getattr(s, p.name) == p.default for p in PARAMETERS if p.request)


def test_the_cli_and_the_chat_offer_every_request_parameter():
    help_text = CliRunner().invoke(app, ["generate", "--help"], env={"COLUMNS": "200"}).output
    for p in PARAMETERS:
        flag = "--" + (p.request or p.name).replace("_", "-")
        assert (flag in help_text) == (p.request is not None), flag
        assert (p.request in SETTABLE) == (p.request is not None)


def _edited_copy(src: Path, dst: Path, config: dict, generation: dict | None = None) -> Path:
    """The checkpoint's JSON files copied to `dst` with keys replaced (None: the key removed)."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors"))
    for name, edits in (("config.json", config), ("generation_config.json", generation or {})):
        data = json.loads((dst / name).read_text())
        data.update(edits)
        (dst / name).write_text(json.dumps({k: v for k, v in data.items() if v is not None}))
    return dst


def test_config_json_parameters_reach_the_defaults(tiny_checkpoint, tmp_path):
    """config.json's block size and coreset are the defaults where generation_config.json is silent
    (a `coreset_top_p` there is not its key), also when the stop tokens come from config.json."""
    config = {"block_size": 16, "moe_block_coreset_enabled": False, "moe_block_coreset_top_p": 0.5}
    generation = {"block_size": None, "eos_token_id": None, "coreset_top_p": 0.7}
    ck = CheckpointConfig.from_dir(_edited_copy(tiny_checkpoint, tmp_path / "ck", config, generation))
    gen = ck.generation
    assert (gen.block_size, gen.coreset_enabled, gen.coreset_top_p) == (16, False, 0.5)
    assert (ck.model.block_size, ck.model.coreset_enabled, ck.model.coreset_top_p) == (16, False, 0.5)
    assert gen.eos_token_ids == (ck.raw["eos_token_id"],)


def test_a_parameter_out_of_its_range_names_its_file_and_key(tiny_checkpoint, tmp_path):
    path = _edited_copy(tiny_checkpoint, tmp_path / "ck", {"moe_block_coreset_top_p": 0.0})
    with pytest.raises(ConfigError) as e:
        CheckpointConfig.from_dir(path)
    assert str(e.value) == "config.json moe_block_coreset_top_p is 0.0: must be a number > 0 and <= 1"


def test_set_takes_a_switch_as_on_or_off():
    out = io.StringIO()
    chat = ChatSession(None, Console(file=out, width=200))  # type: ignore[arg-type]: /set needs no model
    chat.set_option("coreset off")
    chat.set_option("coreset maybe")
    assert chat.request == {"coreset": False}
    assert "/set coreset: 'maybe' is not on or off" in out.getvalue()
