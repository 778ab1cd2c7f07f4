#!/usr/bin/env bash
# Installs libcarmine for C programs: the libraries, the header and a pkg-config file.
#
#   cargo build --release -p carmine-capi
#   crates/capi/install.sh [PREFIX] [LIBDIR]     # default /usr/local, target/release
#
# Then: cc app.c $(pkg-config --cflags --libs carmine)  (PKG_CONFIG_PATH=PREFIX/lib/pkgconfig
# if PREFIX is not one pkg-config searches). Build fio-carmine against the installed copy, so
# that it finds it there: crates/capi/fio/build.sh PREFIX/lib PREFIX/lib/fio.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
prefix=${1:-/usr/local}
libdir=${2:-$here/../../target/release}
[ -f "$libdir/libcarmine.so" ] || {
  echo "no libcarmine.so in $libdir: run cargo build --release -p carmine-capi first" >&2
  exit 1
}
version=$(sed -n 's/^#define CARMINE_VERSION_\(MAJOR\|MINOR\|EXTRA\) \([0-9]*\)$/\2/p' \
  "$here/include/carmine.h" | paste -sd.)
install -d "$prefix/lib/pkgconfig" "$prefix/include"
# No soname yet (the ABI is 0.x): one file, no versioned links.
install -m 0755 "$libdir/libcarmine.so" "$prefix/lib/libcarmine.so"
[ -f "$libdir/libcarmine.a" ] && install -m 0644 "$libdir/libcarmine.a" "$prefix/lib/"
install -m 0644 "$here/include/carmine.h" "$prefix/include/"
cat > "$prefix/lib/pkgconfig/carmine.pc" <<PC
prefix=$prefix
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: carmine
Description: Carmine block-volume client (libcarmine)
Version: $version
Libs: -L\${libdir} -lcarmine
Libs.private: -lpthread -ldl -lm
Cflags: -I\${includedir}
PC
echo "installed libcarmine $version under $prefix"
