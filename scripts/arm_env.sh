#!/bin/bash
# An aarch64 (Raspberry Pi 5 / Cortex-A76) Python for this repository under qemu user-mode, on an
# x86-64 Debian host: `scripts/arm_env.sh DIR` makes DIR/py, a launcher that runs the aarch64
# CPython 3.11 with the repository's current files and numpy/numba/llvmlite at the host's versions.
#
# Where things come from: Debian's apt (qemu-user-static; arm64 .debs of CPython 3.11 and its
# libraries, only unpacked into DIR/sysroot, nothing arm64 is installed) and PyPI (aarch64 wheels,
# unpacked into DIR/site). Downloads are kept in DIR: a second run only copies the repository
# again (DIR/stage), so DIR under ~/.cache makes later runs take seconds.
#
# qemu makes the guest read DIR/sysroot/proc/cpuinfo (its -L prefix covers /proc/cpuinfo): a Pi 5's
# is written there, so LLVM's host detection says cortex-a76 (with the host's x86 cpuinfo it says
# "generic"), and QEMU_CPU=cortex-a76 models that CPU (it must match: qemu enforces the model).
set -euo pipefail
D=${1:?usage: scripts/arm_env.sh DIR}
REPO=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$D"; D=$(cd "$D" && pwd)
PY=${PYTHON:-python3}
VERSIONS=$("$PY" -c 'import numpy, numba, llvmlite; print(f"numpy=={numpy.__version__} numba=={numba.__version__} llvmlite=={llvmlite.__version__}")')
GGUF=$("$PY" -c 'from importlib.metadata import version; print("gguf==" + version("gguf"))')

if ! command -v qemu-aarch64-static >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-user-static >/dev/null
fi

if [ ! -x "$D/sysroot/usr/bin/python3.11" ]; then
  mkdir -p "$D/debs" "$D/sysroot/proc"
  own_arch=0
  dpkg --print-foreign-architectures | grep -qx arm64 || { dpkg --add-architecture arm64; own_arch=1; }
  apt-get update -qq
  libs="gcc-12-base libbz2-1.0 libc6 libcom-err2 libcrypt1 libdb5.3 libexpat1 libffi8 libgcc-s1 libgomp1
    libgssapi-krb5-2 libk5crypto3 libkeyutils1 libkrb5-3 libkrb5support0 liblzma5 libncursesw6 libnsl2
    libpython3.11-minimal libpython3.11-stdlib libreadline8 libsqlite3-0 libssl3 libstdc++6 libtinfo6
    libtirpc3 libuuid1 libzstd1 python3.11-minimal python3.11 zlib1g"
  (cd "$D/debs" && apt-get download -qq $(for p in $libs; do printf '%s:arm64 ' "$p"; done))
  if [ "$own_arch" = 1 ]; then dpkg --remove-architecture arm64; apt-get update -qq; fi
  for deb in "$D"/debs/*.deb; do dpkg -x "$deb" "$D/sysroot"; done
fi

"$PY" - "$D/sysroot/proc/cpuinfo" <<'EOF'
import sys
core = ("processor\t: {i}\nBogoMIPS\t: 108.00\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp "
        "asimdhp cpuid asimdrdm lrcpc dcpop asimddp\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x4\n"
        "CPU part\t: 0xd0b\nCPU revision\t: 1\n\n")
open(sys.argv[1], "w").write("".join(core.format(i=i) for i in range(4)) + "Model\t\t: Raspberry Pi 5 Model B Rev 1.0\n")
EOF

if [ "$(cat "$D/site/.versions" 2>/dev/null)" != "$VERSIONS $GGUF" ]; then
  rm -rf "$D/site" "$D/wheels"; mkdir -p "$D/site" "$D/wheels"
  plat="--platform manylinux2014_aarch64 --platform manylinux_2_17_aarch64 --platform manylinux_2_28_aarch64
    --only-binary=:all: --python-version 3.11 --implementation cp --abi cp311"
  # shellcheck disable=SC2086
  "$PY" -m pip download -q $plat -d "$D/wheels" $VERSIONS "$GGUF" psutil tqdm jinja2 markupsafe pyyaml pytest hypothesis
  # shellcheck disable=SC2086
  "$PY" -m pip install -q --no-index --no-deps --target "$D/site" $plat "$D"/wheels/*.whl
  echo "$VERSIONS $GGUF" > "$D/site/.versions"
fi

# the repository as the package-dir mapping installs it (formats/ -> edge_infer.formats, ...)
rm -rf "$D/stage" "$D/repo"; mkdir -p "$D/stage/edge_infer" "$D/repo"
(cd "$REPO" && git ls-files -z --cached --others --exclude-standard | tar cf - --null -T -) | tar xf - -C "$D/repo"
# each file's time stamped from its own content: numba's cache checks source stamps, and a fresh
# clone's checkout times would make it cold on every CI run; content-derived times change only
# when the file does
"$PY" - "$D/repo" <<'EOF'
import hashlib, os, sys
for root, _, files in os.walk(sys.argv[1]):
    for name in files:
        p = os.path.join(root, name)
        with open(p, "rb") as fh:
            t = 1_500_000_000 + int(hashlib.sha256(fh.read()).hexdigest()[:8], 16) % 100_000_000
        os.utime(p, (t, t))
EOF
for f in "$D"/repo/edge_infer/*; do ln -sfn "$f" "$D/stage/edge_infer/"; done
for p in formats kernels_cpu kernels_cuda; do ln -sfn "$D/repo/$p" "$D/stage/edge_infer/$p"; done

cat > "$D/py" <<EOF
#!/bin/bash
# aarch64 CPython 3.11 under qemu-user, as a Cortex-A76 (scripts/arm_env.sh)
export QEMU_LD_PREFIX=$D/sysroot QEMU_CPU=\${QEMU_CPU:-cortex-a76} PYTHONSAFEPATH=1
export PYTHONPATH=$D/stage:$D/site\${PYTHONPATH:+:\$PYTHONPATH}
export NUMBA_CACHE_DIR=\${NUMBA_CACHE_DIR:-$D/numba-cache}
exec qemu-aarch64-static $D/sysroot/usr/bin/python3.11 "\$@"
EOF
chmod +x "$D/py"
"$D/py" -c 'import platform, numba, llvmlite.binding as ll; print("aarch64 environment:", platform.machine(), "numba", numba.__version__, "LLVM CPU", ll.get_host_cpu_name())'
