"""The decoding parameters' table drives the checkpoint reader, the GGUF keys, the CLI and `/set`."""

from __future__ import annotations

import dataclasses

from clover_convert.metadata import add_diffusion_keys
from gguf import GGUFWriter
from typer.testing import CliRunner

from clover_local.api import defaults_from_gguf
from clover_local.chat import SETTABLE
from clover_local.cli import app
from clover_local.model import gguf_names as gn
from clover_local.model.config import CheckpointConfig, GenerationDefaults
from clover_local.model.decoding_parameters import PARAMETERS, from_request
from clover_local.model.gguf_info import read_info
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
