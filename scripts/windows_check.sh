#!/usr/bin/env bash
# Windows, from Linux: cross-compiles the crate for x86_64-pc-windows-gnu (MinGW), runs the Rust
# unit tests under Wine, and builds the installable abi3 Windows wheel (target/wheels/).
# Needs: rustup, gcc-mingw-w64-x86-64 and wine64 (scripts/setup_env.sh installs them as root).
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=x86_64-pc-windows-gnu
rustup target add "$TARGET" >/dev/null
export WINEDEBUG=-all WINEPREFIX="$PWD/target/wineprefix"
echo "[windows] cargo test --target $TARGET (under Wine)"
cargo test --no-default-features --target "$TARGET" --no-run --quiet
# Rust's std imports ProcessPrng from bcryptprimitives.dll, which Wine 8 lacks: a stand-in of
# ours goes next to the test executables (never into the wheel).
x86_64-w64-mingw32-gcc -shared -O2 -o "target/$TARGET/debug/deps/bcryptprimitives.dll" tests/windows/bcryptprimitives.c -ladvapi32
cargo test --no-default-features --target "$TARGET" --quiet
echo "[windows] maturin build --target $TARGET"
.venv/bin/maturin build --release --target "$TARGET" -o target/wheels --quiet 2>&1 | grep -v "^$" || true
ls target/wheels/*win_amd64.whl
