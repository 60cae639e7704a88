"""safetensors in plain Python for the tests (Debian 12 packages no safetensors).

load(path) -> (tensors, metadata): an insertion-ordered dict name -> torch.Tensor in
header order, and the "__metadata__" dict (empty if absent). It checks what the
format requires (as trainer/safetensors.c does): header length against the file
and the 100 MB limit, JSON starting with '{', no duplicate keys, known dtypes,
shape vs byte size, and tensors tiling the data buffer exactly.

save(path, tensors, metadata=None) writes the bytes cddp's C writer writes for
the same input: compact JSON, "__metadata__" first, tensors in the given order,
header padded with spaces to a multiple of 8. So a file written by one can be
compared byte for byte with a file written by the other.
"""
import json
import struct

import torch

MAX_HEADER = 100_000_000

DTYPES = {
    "BOOL": (torch.bool, 1),
    "U8": (torch.uint8, 1),
    "I8": (torch.int8, 1),
    "I16": (torch.int16, 2),
    "F16": (torch.float16, 2),
    "BF16": (torch.bfloat16, 2),
    "I32": (torch.int32, 4),
    "F32": (torch.float32, 4),
    "F64": (torch.float64, 8),
    "I64": (torch.int64, 8),
}
NAMES = {dt: name for name, (dt, _) in DTYPES.items()}


class FormatError(ValueError):
    pass


def _no_duplicates(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise FormatError(f"duplicate key {k!r}")
        d[k] = v
    return d


def decode(blob):
    """(tensors, metadata) from the bytes of a whole file."""
    if len(blob) < 8:
        raise FormatError("file shorter than 8 bytes")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > MAX_HEADER:
        raise FormatError(f"header length {n} over the 100 MB limit")
    if 8 + n > len(blob):
        raise FormatError(f"header length {n} runs past the end of the file")
    text = blob[8:8 + n].decode("utf-8")
    if not text.startswith("{"):
        raise FormatError("header does not start with '{'")
    header = json.loads(text, object_pairs_hook=_no_duplicates)
    metadata = header.pop("__metadata__", None) or {}
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise FormatError("__metadata__ must map strings to strings")
    data = memoryview(blob)[8 + n:]
    spans = []
    tensors = {}
    for name, info in header.items():
        if set(info) != {"dtype", "shape", "data_offsets"}:
            raise FormatError(f"{name}: fields {sorted(info)}")
        if info["dtype"] not in DTYPES:
            raise FormatError(f"{name}: unsupported dtype {info['dtype']}")
        dtype, size = DTYPES[info["dtype"]]
        shape = info["shape"]
        begin, end = info["data_offsets"]
        numel = 1
        for d in shape:
            numel *= d
        if end - begin != numel * size or begin > end or end > len(data):
            raise FormatError(f"{name}: data_offsets {[begin, end]} do not fit {shape}")
        spans.append((begin, end, name))
        if numel == 0:
            tensors[name] = torch.empty(shape, dtype=dtype)
        else:
            raw = bytearray(data[begin:end])  # a copy: aligned and writable
            tensors[name] = torch.frombuffer(raw, dtype=dtype).reshape(shape)
    pos = 0
    for begin, end, name in sorted(spans):
        if begin != pos:
            raise FormatError(f"{name}: {'overlap' if begin < pos else 'hole'} at offset {begin}")
        pos = end
    if pos != len(data):
        raise FormatError(f"tensors cover {pos} of {len(data)} data bytes")
    return tensors, metadata


def load(path):
    with open(path, "rb") as fh:
        return decode(fh.read())


def _data(t):
    return t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes() \
        if t.numel() else b""


def encode(tensors, metadata=None):
    """The whole file as bytes."""
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs = []
    off = 0
    for name, t in tensors.items():
        if t.dtype not in NAMES:
            raise FormatError(f"{name}: dtype {t.dtype} not supported here")
        b = _data(t)
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    text = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def save(path, tensors, metadata=None):
    with open(path, "wb") as fh:
        fh.write(encode(tensors, metadata))
