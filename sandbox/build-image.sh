#!/usr/bin/env bash
# Build the Docker image `agentrl-sandbox` offline: a root filesystem made from the host's own
# Debian python3 (its stdlib and the shared libraries it links) plus busybox-static for the shell
# tools, `docker import`ed with the executor baked in. Nothing is pulled from a registry.
#
# Usage: sandbox/build-image.sh [--force] [TAG]      (default tag: agentrl-sandbox:latest)
# Needs: docker (a running engine), /usr/bin/python3 (Debian python3), busybox-static, ldd.
# With a registry, `docker build -f sandbox/Dockerfile -t agentrl-sandbox .` builds the same thing.
set -euo pipefail
cd "$(dirname "$0")/.."

force=0
if [[ "${1:-}" == "--force" ]]; then force=1; shift; fi
tag="${1:-agentrl-sandbox:latest}"
py="$(readlink -f /usr/bin/python3)"
sha="$(sha256sum agentrl/sandbox/executor.py | cut -c1-16)"

if [[ $force == 0 ]] && [[ "$(docker image inspect -f '{{index .Config.Labels "agentrl.executor"}}' "$tag" 2>/dev/null)" == "$sha" ]]; then
    echo "image $tag is up to date (executor $sha)"
    exit 0
fi
[[ -x "$py" ]] || { echo "error: /usr/bin/python3 not found; apt-get install -y python3" >&2; exit 1; }
[[ -x /bin/busybox ]] && /bin/busybox --list >/dev/null 2>&1 || { echo "error: busybox-static missing; apt-get install -y busybox-static" >&2; exit 1; }

root="$(mktemp -d /tmp/agentrl-rootfs.XXXXXX)"
trap 'rm -rf "$root"' EXIT
stdlib="$("$py" -I -S -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')"

mkdir -p "$root"/{bin,usr/bin,etc,tmp,work,opt/agentrl,run/agentrl,proc,dev,sys}
chmod 1777 "$root/tmp" "$root/work"
cp -a "$py" "$root/usr/bin/"
ln -s "$(basename "$py")" "$root/usr/bin/python3"
mkdir -p "$root$(dirname "$stdlib")"
tar -C / --exclude='test' --exclude='tests' --exclude='idlelib' --exclude='tkinter' --exclude='turtledemo' \
    --exclude='ensurepip' --exclude='lib2to3' --exclude='pydoc_data' --exclude='config-*' \
    -cf - "${stdlib#/}" | tar -C "$root" -xf -

# Shared libraries of the interpreter and of every extension module, at their host paths.
{ ldd "$py"; find "$stdlib/lib-dynload" -name '*.so' -exec ldd {} \; ; } 2>/dev/null \
    | grep -oE '/[^ ]+\.so[^ ]*' | sort -u | while read -r lib; do
        mkdir -p "$root$(dirname "$lib")"
        cp -L "$lib" "$root$lib"
    done
# The dynamic loader's canonical path.
ld="$(ldd "$py" | grep -oE '/lib[^ ]*ld-linux[^ ]*' | head -1)"
mkdir -p "$root$(dirname "$ld")" && cp -L "$ld" "$root$ld"

cp /bin/busybox "$root/bin/busybox"
for applet in $(/bin/busybox --list); do
    [[ -e "$root/bin/$applet" ]] || ln -s busybox "$root/bin/$applet"
done
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/work:/bin/sh\n' > "$root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' > "$root/etc/group"
install -m 0444 agentrl/sandbox/executor.py "$root/opt/agentrl/executor.py"
# Precompiled by the image's own interpreter: a start-up skips ~20 ms of compiling.
"$py" -I -S -c 'import py_compile, sys; py_compile.compile(sys.argv[1], cfile=sys.argv[2], doraise=True)' \
    agentrl/sandbox/executor.py "$root/opt/agentrl/executor.pyc"
chmod 0444 "$root/opt/agentrl/executor.pyc"

tar -C "$root" --numeric-owner -cf - . | docker import \
    --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'WORKDIR /work' \
    --change 'USER 65534:65534' \
    --change "LABEL agentrl.executor=$sha" \
    --change 'CMD ["python3", "-I", "-S", "/opt/agentrl/executor.pyc"]' \
    - "$tag" >/dev/null
echo "built $tag (executor $sha, $(du -sh "$root" | cut -f1) rootfs)"
