"""Files in another format, named by their first bytes, with the next step for each.

A safetensors file begins with its header length, so another format's magic number read as one
is a length of billions of bytes (GQ102), which tells the user nothing. The formats people hand
gptqfmt by mistake are named instead: a git-LFS pointer (GQ117), and GGUF, PyTorch's torch.save
(ZIP or legacy pickle), a pickle or a ZIP archive (GQ130). Only the first SNIFF_BYTES bytes are
looked at; which bytes could still begin a safetensors file is header.other_format's to say.
"""
from __future__ import annotations

import json
import re
import shlex
import struct
from dataclasses import dataclass
from pathlib import PurePath

from ..findings import Finding

#: what identify() needs of a file: the magic numbers, and a ZIP archive's first entry name
SNIFF_BYTES = 512

LFS_MAGIC = b"version https://git-lfs"
GGUF_MAGIC = b"GGUF"                     # then the version, a little-endian uint32
ZIP_MAGIC = b"PK\x03\x04"                # a ZIP local file header
PICKLE_PROTO = 0x80                      # pickle's PROTO opcode, then the protocol (2 to 5)
#: torch.save's legacy format begins with the pickled torch.serialization.MAGIC_NUMBER
#: (0x1950a86a20f9469cfc6c as a LONG1 opcode), right after PROTO, or after FRAME from protocol 4
TORCH_LEGACY_MAGIC = b"\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19"
#: torch.save's ZIP format writes `<archive>/data.pkl` first (TorchScript's torch.jit.save does
#: not, and torch.load(weights_only=True) refuses those)
TORCH_ZIP_ENTRY = re.compile(r"^[^/]+/data\.pkl$")
_ZIP_NAME_AT = 26                        # name length (uint16), extra length, then the name

#: names of weights in another format that a directory may hold instead of safetensors
WEIGHT_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".gguf")
#: transformers' Trainer state, beside the weights in a training checkpoint: not weights
TRAINER_STATE = re.compile(r"^(training_args\.bin|optimizer\.pt|scheduler\.pt|scaler\.pt|"
                           r"rng_state(_\d+)?\.pth)$")

LFS, GGUF, TORCH, PICKLE, ZIP = "lfs", "gguf", "torch", "pickle", "zip"


@dataclass(frozen=True)
class Other:
    """A format identified by its first bytes: `kind` (one of the names above) and `what`, the
    words for it ("a GGUF file (version 3), llama.cpp's format")."""
    kind: str
    what: str


def identify(prefix: bytes) -> Other | None:
    """The format whose magic number `prefix` (a file's first bytes) begins with, if any."""
    if prefix.startswith(LFS_MAGIC):
        return Other(LFS, "a git-LFS pointer file")
    if prefix.startswith(GGUF_MAGIC):
        version = struct.unpack("<I", prefix[4:8])[0] if len(prefix) >= 8 else None
        known = f" (version {version})" if version is not None and 1 <= version < 100 else ""
        return Other(GGUF, f"a GGUF file{known}, llama.cpp's format")
    if prefix.startswith(ZIP_MAGIC):
        entry = _first_zip_entry(prefix)
        if entry is not None and TORCH_ZIP_ENTRY.match(entry):
            return Other(TORCH, f"a PyTorch checkpoint (torch.save's ZIP format, entry {entry})")
        return Other(ZIP, "a ZIP archive" + (f" (first entry {entry})" if entry else ""))
    if len(prefix) >= 2 and prefix[0] == PICKLE_PROTO and 2 <= prefix[1] <= 5:
        if TORCH_LEGACY_MAGIC in prefix[2:32]:
            return Other(TORCH, "a PyTorch checkpoint (torch.save's legacy pickle format)")
        return Other(PICKLE, f"a Python pickle (protocol {prefix[1]})")
    return None


def _first_zip_entry(prefix: bytes) -> str | None:
    """The first entry's name from the local file header, where `prefix` holds all of it."""
    if len(prefix) < _ZIP_NAME_AT + 4:
        return None
    (n,) = struct.unpack_from("<H", prefix, _ZIP_NAME_AT)
    start = _ZIP_NAME_AT + 4
    raw = prefix[start:start + n]
    if n == 0 or len(raw) < n:
        return None
    name = raw.decode("utf-8", "replace")
    return name if name.isprintable() else None  # never print a stranger's control bytes


def finding(other: Other, file: str, path: str) -> Finding:
    """The finding for a file in another format: GQ117 for a git-LFS pointer, GQ130 for the
    rest. `file` is the name to report, `path` the file as the user reaches it (for the next
    step's command)."""
    if other.kind == LFS:
        return Finding("GQ117", f"starts with '{LFS_MAGIC.decode()}': a git-LFS pointer file, "
                       "not the shard itself", file=file, hint=next_step(other, path))
    return Finding("GQ130", f"{other.what}, not safetensors{consequence(other)}", file=file,
                   hint=next_step(other, path))


def consequence(other: Other) -> str:
    """What the format means for gptqfmt, where there is more to say than "convert it"."""
    if other.kind == GGUF:
        return "; gptqfmt checks GPTQ checkpoints in safetensors, so there is nothing here for " \
               "it to check"
    return ""


def next_step(other: Other, path: str, more: int = 0, then: str | None = None) -> str:
    """What to do with the file at `path` (and `more` like it), of a format gptqfmt does not
    read, as a command on the user's paths; `then` is what to pass to gptqfmt afterwards (by
    default the file that the command writes)."""
    quoted = shlex.quote(path)
    if other.kind == LFS:
        parent = str(PurePath(path).parent)
        cd = "" if parent == "." else f"cd {shlex.quote(parent)} && "
        return f"fetch the content in the clone it came from: `{cd}git lfs pull` (or download " \
               "the file again)"
    if other.kind == GGUF:
        return f"to see what it holds: `gguf-dump {quoted}` (pip install gguf)"
    if other.kind == TORCH:
        target = safetensors_name(path)
        rest = f" (likewise for the {more} other file{'s' if more > 1 else ''})" if more else ""
        return (f"convert the weights to safetensors first{rest}: "
                f"`{convert_command(path, target)}`, then pass {shlex.quote(then or target)}")
    if other.kind == ZIP:
        out = shlex.quote(str(PurePath(path).with_suffix("")))
        return "if it holds a checkpoint, unpack it and pass the directory: " \
               f"`unzip {quoted} -d {out}`"
    return ("save the weights with safetensors (safetensors.torch.save_file, or "
            "save_pretrained) and pass that file")


def safetensors_name(path: str) -> str:
    """Where the safetensors twin of a PyTorch weights file goes: beside it, named the way
    transformers names them (pytorch_model-00001-of-00002.bin: model-00001-of-00002.safetensors)."""
    p = PurePath(path)
    stem = p.stem
    if stem.startswith("pytorch_model"):
        stem = "model" + stem[len("pytorch_model"):]
    if p.suffix == ".safetensors":  # misnamed: never write over the only copy
        stem += ".converted"
    return str(p.with_name(stem + ".safetensors"))


def convert_command(src: str, dst: str) -> str:
    """A shell command that writes the tensors of torch.save's file `src` to safetensors `dst`,
    bit for bit. weights_only refuses pickled code; clone() gives tied weights their own storage,
    which save_file requires."""
    code = ("import torch, safetensors.torch as st; st.save_file({k: v.contiguous().clone() "
            f"for k, v in torch.load({_py(src)}, map_location=\"cpu\", weights_only=True)"
            f".items()}}, {_py(dst)})")
    return f"python -c {shlex.quote(code)}"


def _py(s: str) -> str:
    """`s` as a double-quoted Python literal (JSON's escapes are Python's), so that the code
    that shlex quotes holds no ' of its own and stays readable."""
    return json.dumps(s, ensure_ascii=False)


def weights_name(name: str) -> bool:
    """Whether a directory entry is named like weights in another format."""
    return name.endswith(WEIGHT_SUFFIXES) and not TRAINER_STATE.match(name)
