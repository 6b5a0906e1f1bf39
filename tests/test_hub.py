"""Downloads from the Hub (faked: no network): the runtime's GGUF resolution and the converter's
checkpoint download share one import check and one translation of the Hub's errors."""

from __future__ import annotations

import huggingface_hub
import pytest
from clover_convert import hub as convert_hub
from clover_convert.errors import ConvertError
from huggingface_hub.errors import RepositoryNotFoundError

from clover_local.model import location
from clover_local.model.gguf_info import ModelFileError

FILES = ["README.md", "m-Q8_0.gguf", "m-Q4_K_M-00001-of-00002.gguf", "m-Q4_K_M-00002-of-00002.gguf"]


def test_a_repo_spec_downloads_the_matching_split_files(monkeypatch, tmp_path):
    got = []

    def download(repo_id: str, name: str) -> str:
        got.append((repo_id, name))
        return str(tmp_path / name)

    monkeypatch.setattr(huggingface_hub, "list_repo_files", lambda repo_id: FILES)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    path = location.resolve("owner/name:Q4_K_M")
    assert path == tmp_path / "m-Q4_K_M-00001-of-00002.gguf"
    assert got == [
        ("owner/name", "m-Q4_K_M-00001-of-00002.gguf"),
        ("owner/name", "m-Q4_K_M-00002-of-00002.gguf"),
    ]


@pytest.mark.parametrize(
    "run, error",
    [
        (lambda: location.resolve("owner/name:Q4_K_M"), ModelFileError),
        (lambda: convert_hub.resolve("owner/name"), ConvertError),
    ],
    ids=["runtime", "converter"],
)
def test_hub_errors_become_the_callers_one_line_error(monkeypatch, run, error):
    def missing(*args, **kwargs):
        # built without its HTTP response (its constructor's needs vary by version): only its type counts
        raise RepositoryNotFoundError.__new__(RepositoryNotFoundError)

    def offline(*args, **kwargs):
        raise OSError("network unreachable\nretry later")

    for name in ("list_repo_files", "snapshot_download"):
        monkeypatch.setattr(huggingface_hub, name, missing)
    with pytest.raises(error, match=r"^owner/name: no such Hugging Face repository \(or it is gated"):
        run()
    for name in ("list_repo_files", "snapshot_download"):
        monkeypatch.setattr(huggingface_hub, name, offline)
    with pytest.raises(error, match=r"^owner/name: download failed \(network unreachable\)$"):
        run()

    class ConnectError(Exception):  # the HTTP client's own error type (httpx is not an OSError)
        __module__ = "httpx"

    def no_dns(*args, **kwargs):
        raise ConnectError("[Errno -2] Name or service not known")

    for name in ("list_repo_files", "snapshot_download"):
        monkeypatch.setattr(huggingface_hub, name, no_dns)
    with pytest.raises(error, match=r"^owner/name: download failed, network error \(\[Errno -2\] Name"):
        run()
