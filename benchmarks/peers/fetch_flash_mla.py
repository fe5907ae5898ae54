"""Put a built FlashMLA where `fmha bench` finds it: `import flash_mla` from `.peers/` (git-ignored).

The device has no network and no FlashMLA, but vLLM's Linux wheels carry FlashMLA built for sm_90 / sm_100 as
`vllm/_flashmla_C.abi3.so` (torch's stable C ABI, CUDA 13) with FlashMLA's own Python interface beside it
(`vllm/third_party/flashmla/flash_mla_interface.py`). This script reads just those members out of one vLLM wheel on
PyPI with HTTP range requests (the wheel is ~300 MB; the members ~2 MB), checks each against the wheel's RECORD
hashes, and writes

    .peers/vllm/__init__.py                        (empty: only a package for the extension to load from)
    .peers/vllm/_flashmla_C.abi3.so
    .peers/vllm/third_party/flashmla/...           (FlashMLA's interface as vLLM ships it)
    .peers/flash_mla/__init__.py                   (re-exports that interface under FlashMLA's own name)

Run it on a machine that reaches PyPI, then carry `.peers` to the device and put it on PYTHONPATH:

    python benchmarks/peers/fetch_flash_mla.py
    (device, carry [".peers"]) PYTHONPATH=src:.peers python3 -m fmha.cli bench mla --out $OUT/mla.json

Nothing fetched is committed: `.peers/` is in .gitignore.
"""
import argparse
import base64
import csv
import hashlib
import io
import json
import os
import urllib.request
import zipfile

# vLLM 0.26.0 pins torch 2.11.0 (the device's) and links CUDA 13 (libcudart.so.13), as the device's torch does.
DEFAULT_VERSION = "0.26.0"
MEMBERS = ("vllm/_flashmla_C.abi3.so", "vllm/third_party/flashmla/__init__.py",
           "vllm/third_party/flashmla/flash_mla_interface.py")
SHIM = ('"""FlashMLA as vLLM {version} ships it (fetched by benchmarks/peers/fetch_flash_mla.py)."""\n'
        "from vllm.third_party.flashmla.flash_mla_interface import (  # noqa: F401\n"
        "    FlashMLASchedMeta, flash_mla_sparse_fwd, flash_mla_with_kvcache, get_mla_metadata)\n"
        "__version__ = 'vllm-{version}'\n")


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
    parser.add_argument("--version", default=DEFAULT_VERSION, help="the vLLM wheel to read FlashMLA from")
    parser.add_argument("--dest", default=os.path.join(os.path.dirname(__file__), "..", "..", ".peers"))
    args = parser.parse_args()
    wheel = zipfile.ZipFile(io.BufferedReader(RangeFile(wheel_url(args.version)), buffer_size=1 << 20))
    hashes = record_hashes(wheel)
    for name in MEMBERS:
        data = wheel.read(name)
        algo, want = hashes[name].split("=", 1)
        got = base64.urlsafe_b64encode(hashlib.new(algo, data).digest()).rstrip(b"=").decode()
        if got != want:
            raise SystemExit(f"{name}: {algo} {got} does not match the wheel's RECORD ({want})")
        path = os.path.join(args.dest, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        print(f"{path}: {len(data)} bytes, {algo} checked")
    for path, text in ((os.path.join(args.dest, "vllm", "__init__.py"), ""),
                       (os.path.join(args.dest, "flash_mla", "__init__.py"), SHIM.format(version=args.version))):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        print(f"{path}: written")


if __name__ == "__main__":
    main()
