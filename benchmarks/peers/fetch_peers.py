"""Put built peers where `fmha bench` finds them: FlashMLA (`import flash_mla`) and FlashAttention-3
(`import flash_attn_interface`) from `.peers/` (git-ignored).

The device has no network and neither peer, but vLLM's Linux wheels carry both built for Hopper:
FlashMLA as `vllm/_flashmla_C.abi3.so` (torch's stable C ABI, CUDA 13, sm_90 / sm_100) with FlashMLA's own Python
interface beside it (`vllm/third_party/flashmla/flash_mla_interface.py`), and FlashAttention-3 as
`vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so` (linked against the torch that wheel pins) with vLLM's interface to it.
This script reads just those members out of one vLLM wheel on PyPI with HTTP range requests (the wheel is ~300 MB),
checks each against the wheel's RECORD hashes, and writes under `.peers/`:

    vllm/__init__.py                          empty: a package for the extensions to load from
    vllm/_flashmla_C.abi3.so, vllm/third_party/flashmla/...
    flash_mla/__init__.py                     re-exports FlashMLA's interface under FlashMLA's own name
    vllm/vllm_flash_attn/...                  (--fa3) FA3's extension, gzipped (153 MB unpacked; the device's
                                              carry holds 64 MiB), and vLLM's interface
    flash_attn_interface.py                   (--fa3) FA3's `flash_attn_func` over that build's varlen entry

Run it on a machine that reaches PyPI, carry `.peers` to the device, unpack and put it on PYTHONPATH:

    python benchmarks/peers/fetch_peers.py [--fa3]
    (device, carry [".peers"]) gunzip -kf .peers/vllm/vllm_flash_attn/*.gz;
        PYTHONPATH=src:.peers python3 -m fmha.cli bench mla --out $OUT/mla.json

Nothing fetched is committed: `.peers/` is in .gitignore.
"""
import argparse
import base64
import csv
import gzip
import hashlib
import io
import json
import os
import urllib.request
import zipfile

# vLLM 0.26.0 pins torch 2.11.0 (the device's) and links CUDA 13 (libcudart.so.13), as the device's torch does.
DEFAULT_VERSION = "0.26.0"
FLASH_MLA = ("vllm/_flashmla_C.abi3.so", "vllm/third_party/flashmla/__init__.py",
             "vllm/third_party/flashmla/flash_mla_interface.py")
FA3 = ("vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so", "vllm/vllm_flash_attn/__init__.py",
       "vllm/vllm_flash_attn/flash_attn_interface.py")
FLASH_MLA_SHIM = '''"""FlashMLA as vLLM {version} ships it (fetched by benchmarks/peers/fetch_peers.py)."""
from vllm.third_party.flashmla.flash_mla_interface import (  # noqa: F401
    FlashMLASchedMeta, flash_mla_sparse_fwd, flash_mla_with_kvcache, get_mla_metadata)
__version__ = "vllm-{version}"
'''
FA3_SHIM = '''"""FlashAttention-3 as vLLM {version} ships it (fetched by benchmarks/peers/fetch_peers.py): FA3's batched
`flash_attn_func` over that build's varlen entry, the only one it exposes (equal lengths, cu_seqlens made once a
shape)."""
import torch
from vllm.vllm_flash_attn.flash_attn_interface import flash_attn_varlen_func

__version__ = "vllm-{version} FA3 (varlen entry)"
_CU_SEQLENS = {{}}


def _cu_seqlens(b, s, device):
    key = (b, s, device)
    if key not in _CU_SEQLENS:
        _CU_SEQLENS[key] = torch.arange(0, (b + 1) * s, s, dtype=torch.int32, device=device)
    return _CU_SEQLENS[key]


def flash_attn_func(q, k, v, softmax_scale=None, causal=False):
    (b, sq), sk = q.shape[:2], k.shape[1]
    out = flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), sq, _cu_seqlens(b, sq, q.device),
                                 sk, _cu_seqlens(b, sk, q.device), softmax_scale=softmax_scale, causal=causal,
                                 fa_version=3)
    return out.unflatten(0, (b, sq))
'''


class RangeFile(io.RawIOBase):
    """A read-only file over HTTP range requests, so that zipfile reads the central directory and the members it
    needs, not the whole wheel."""

    def __init__(self, url):
        self.url, self.pos = url, 0
        head = urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=60)
        self.size = int(head.headers["Content-Length"])

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self.pos

    def seek(self, offset, whence=0):
        self.pos = (offset, self.pos + offset, self.size + offset)[whence]
        return self.pos

    def readinto(self, buf):
        end = min(self.size, self.pos + len(buf))
        if end <= self.pos:
            return 0
        req = urllib.request.Request(self.url, headers={"Range": f"bytes={self.pos}-{end - 1}"})
        data = urllib.request.urlopen(req, timeout=300).read()
        buf[:len(data)] = data
        self.pos += len(data)
        return len(data)


def wheel_url(version):
    req = urllib.request.Request("https://pypi.org/simple/vllm/",
                                 headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    files = json.load(urllib.request.urlopen(req, timeout=60))["files"]
    names = [f for f in files if f["filename"].startswith(f"vllm-{version}-") and
             f["filename"].endswith("x86_64.whl")]
    if not names:
        raise SystemExit(f"no x86_64 wheel of vllm {version} on PyPI")
    return names[0]["url"]


def record_hashes(wheel):
    record = next(n for n in wheel.namelist() if n.endswith(".dist-info/RECORD"))
    rows = csv.reader(io.StringIO(wheel.read(record).decode()))
    return {row[0]: row[1] for row in rows if len(row) >= 2 and row[1]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", default=DEFAULT_VERSION, help="the vLLM wheel to read the peers from")
    parser.add_argument("--dest", default=os.path.join(os.path.dirname(__file__), "..", "..", ".peers"))
    parser.add_argument("--fa3", action="store_true", help="FlashAttention-3 too (38 MB gzipped)")
    args = parser.parse_args()
    wheel = zipfile.ZipFile(io.BufferedReader(RangeFile(wheel_url(args.version)), buffer_size=1 << 20))
    hashes = record_hashes(wheel)
    files = {"vllm/__init__.py": b"", "flash_mla/__init__.py": FLASH_MLA_SHIM.format(version=args.version).encode()}
    if args.fa3:
        files["flash_attn_interface.py"] = FA3_SHIM.format(version=args.version).encode()
    for name in FLASH_MLA + (FA3 if args.fa3 else ()):
        data = wheel.read(name)
        algo, want = hashes[name].split("=", 1)
        got = base64.urlsafe_b64encode(hashlib.new(algo, data).digest()).rstrip(b"=").decode()
        if got != want:
            raise SystemExit(f"{name}: {algo} {got} does not match the wheel's RECORD ({want})")
        print(f"{name}: {len(data)} bytes, {algo} checked")
        files[name] = data
    for name, data in files.items():
        path = os.path.join(args.dest, name)
        if len(data) > 32 << 20:            # the FA3 extension: carried gzipped, unpacked on the device
            path, data = path + ".gz", gzip.compress(data, compresslevel=6)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        print(f"{path}: written, {len(data)} bytes")


if __name__ == "__main__":
    main()
