"""The safetensors format (github.com/huggingface/safetensors) with PyTorch alone, for the tests:
the safetensors package is not needed. Used by make_safetensors_reference.py (writing) and by
read_safetensors.py (reading what gradwire writes)."""
import json
import struct

import torch

DTYPES = {torch.float32: "F32", torch.float64: "F64", torch.int64: "I64", torch.bool: "BOOL",
          torch.float16: "F16", torch.bfloat16: "BF16"}
TORCH_DTYPES = {name: dtype for dtype, name in DTYPES.items()}


def save(path, tensors, metadata=None):
    """Writes {name: tensor} as the reference implementation does: larger elements first, then
    by name; the header padded with spaces to a multiple of 8 bytes."""
    order = sorted(tensors, key=lambda n: (-tensors[n].element_size(), n))
    header, chunks, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name in order:
        t = tensors[name].detach().contiguous()
        data = bytes(t.reshape(-1).view(torch.uint8).tolist()) if t.numel() else b""
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))


def load(path):
    """Returns ({name: tensor}, metadata) from a safetensors file."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    metadata = header.pop("__metadata__", {})
    buffer = data[8 + n:]
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        dtype = TORCH_DTYPES[info["dtype"]]
        raw = torch.tensor(list(buffer[begin:end]), dtype=torch.uint8)
        tensors[name] = raw.view(dtype).reshape(info["shape"])
    return tensors, metadata
