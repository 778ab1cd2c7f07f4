#!/usr/bin/env bash
# Builds fio-carmine (libfio_carmine.so) against the headers of the exact fio installed.
#
#   crates/capi/fio/build.sh LIBDIR [OUTDIR]
#
# LIBDIR holds libcarmine.so (target/release after `cargo build --release -p carmine-capi`);
# OUTDIR (default LIBDIR) receives libfio_carmine.so, linked to LIBDIR by rpath.
#
# fio ships no headers and keeps no stable engine ABI, so the engine is compiled inside the
# source tree of the very fio version `fio --version` names: Debian's source package of the
# installed version, fetched with `apt-get source` (a deb-src entry is added when missing; that
# needs root), or an unpacked tree given as FIO_SRC. The tree is kept in
# ${CARMINE_FIO_SRC_CACHE:-target/fio-src} for the next build.
set -euo pipefail

libdir=$(realpath "${1:?usage: build.sh LIBDIR [OUTDIR]}")
outdir=$(realpath "${2:-$libdir}")
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)

command -v fio >/dev/null || { echo "fio is not installed" >&2; exit 1; }
fio_version=$(fio --version) # e.g. fio-3.33
[ -f "$libdir/libcarmine.so" ] || { echo "no libcarmine.so in $libdir" >&2; exit 1; }

src=${FIO_SRC:-}
if [ -z "$src" ]; then
  cache=${CARMINE_FIO_SRC_CACHE:-$repo/target/fio-src}
  src="$cache/${fio_version}"
  if [ ! -f "$src/fio.h" ]; then
    pkg_version=$(dpkg-query -W -f='${Version}' fio 2>/dev/null) || {
      echo "fio is not a Debian package here: give its source tree as FIO_SRC" >&2
      exit 1
    }
    if ! grep -rqsE '^(Types:.*deb-src|deb-src )' /etc/apt/sources.list /etc/apt/sources.list.d/; then
      if [ "$(id -u)" != 0 ]; then
        echo "no deb-src entry for Debian's source packages: add one (or run as root), or set FIO_SRC" >&2
        exit 1
      fi
      echo "adding a deb-src entry for Debian's source packages"
      if [ -f /etc/apt/sources.list.d/debian.sources ]; then
        sed -e 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources \
          > /etc/apt/sources.list.d/carmine-deb-src.sources
      elif grep -qs '^deb ' /etc/apt/sources.list; then
        sed -n 's/^deb /deb-src /p' /etc/apt/sources.list > /etc/apt/sources.list.d/carmine-deb-src.list
      else
        echo "no Debian sources found to derive a deb-src entry from; set FIO_SRC" >&2
        exit 1
      fi
      apt-get update -qq
    fi
    command -v dpkg-source >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dpkg-dev
    mkdir -p "$cache"
    tmp=$(mktemp -d "$cache/.tmp.XXXX")
    (cd "$tmp" && apt-get source -qq "fio=$pkg_version" 2>&1 | grep -v unsandboxed || true)
    unpacked=$(find "$tmp" -mindepth 1 -maxdepth 1 -type d -name 'fio-*' | head -1)
    [ -n "$unpacked" ] || { echo "apt-get source fio=$pkg_version unpacked nothing" >&2; exit 1; }
    rm -rf "$src"
    mv "$unpacked" "$src"
    rm -rf "$tmp"
  fi
fi

# The tree must be the installed version, or the structures the engine touches may differ.
tree_version=$(sed -n 's/^DEF_VER=//p' "$src/FIO-VERSION-GEN")
if [ "$tree_version" != "$fio_version" ]; then
  echo "fio source in $src is $tree_version but the installed fio is $fio_version" >&2
  exit 1
fi
if [ ! -f "$src/config-host.h" ]; then
  # As Debian configures it. The features found here may differ from the build machine's
  # (libaio, numa, rdma), which changes only a union at the end of struct io_u that the
  # engine never touches: see docs/decisions/0011-libcarmine.md.
  (cd "$src" && ./configure --disable-native --prefix=/usr >/dev/null)
fi

cc=${CC:-cc}
"$cc" -shared -fPIC -O2 -g -Wall -D_GNU_SOURCE \
  -DCARMINE_FIO_BUILT_FOR="\"$fio_version\"" \
  -include "$src/config-host.h" -I"$src" -I"$here/../include" \
  -o "$outdir/libfio_carmine.so" "$here/fio_carmine.c" \
  -L"$libdir" -Wl,-rpath,"$libdir" -lcarmine
echo "built $outdir/libfio_carmine.so for $fio_version"
