#!/usr/bin/env bash
# Run HERE (Debian 12, with apt) before a GPU session: downloads the Debian packages the GPU
# machine lacks (Open MPI, yaml-cpp, CLI11, nlohmann-json, Catch2 and their library
# dependencies) as .deb files into <repo>/.deb (ignored by git). run.sh unpacks them there with
# dpkg -x when the machine has no MPI of its own. Pass `.deb` in the device tool's `carry`.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DEST="$REPO/.deb"
mkdir -p "$DEST"
grep -qx '/.deb/' "$REPO/.git/info/exclude" 2>/dev/null || echo '/.deb/' >>"$REPO/.git/info/exclude"
ROOTS=(openmpi-bin libopenmpi-dev libopenmpi3 openmpi-common libyaml-cpp-dev libyaml-cpp0.7
  libcli11-dev nlohmann-json3-dev catch2)
# Never carry the C runtime or anything the GPU machine's own system provides.
SKIP='^(libc6|libc6-dev|libgcc-s1|libstdc\+\+6|libstdc\+\+-.*-dev|gcc-.*|g\+\+-.*|cpp-.*|libgcc-.*-dev|zlib1g|zlib1g-dev|perl.*|libperl.*|debconf.*|dpkg|tar|coreutils|bash|dash|sensible-utils|init-system-helpers|libcrypt1|libcrypt-dev|linux-libc-dev|libselinux1|libpcre2-8-0|python3.*|libpython3.*|libexpat1|libffi8|libssl3|openssl|ca-certificates|libgfortran5|gfortran.*|libgfortran-.*-dev|libquadmath0|libgomp1|libatomic1|libasan.*|liblsan.*|libtsan.*|libubsan.*|libitm1|libcc1-0|binutils.*|libbinutils|libctf.*|libgprofng0|libjansson4|libisl23|libmpc3|libmpfr6|libgmp10|libzstd1|liblzma5|libbz2-1.0|libtinfo6|libsystemd0|libudev1|libcap2|libmd0|libbsd0|libdb5.3|libgdbm.*|netbase|mime-support|media-types|tzdata|readline-common|libreadline8|libsqlite3-0|libncursesw6|libuuid1|libblkid1|libmount1|libsmartcols1)$'
mapfile -t pkgs < <(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
  --no-breaks --no-replaces --no-enhances "${ROOTS[@]}" 2>/dev/null |
  grep -E '^[a-zA-Z0-9]' | sed 's/:any$//' | sort -u | grep -Ev "$SKIP" || true)
echo "downloading ${#pkgs[@]} packages into $DEST"
cd "$DEST"
for p in "${pkgs[@]}"; do
  apt-get download "$p" >/dev/null 2>&1 || echo "  (no candidate for $p, skipped)"
done
du -sh "$DEST"
