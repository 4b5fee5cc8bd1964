#!/usr/bin/env bash
# Runs the README's "Your own images" section as written, command by command, in a fresh folder (the checkout's
# docs/ linked into it, python3 the venv's), and prints how long each command and the whole took: the time the
# README states comes from this.
#   bash docs/examples/own_images.sh            # after bash setup.sh setup and the images extra
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="$root/.venv/bin"
[ -x "$venv/python3" ] || { echo "own_images.sh: no venv at $root/.venv: run bash setup.sh setup first" >&2; exit 2; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
ln -s "$root/docs" "$work/docs"

# The section's commands: its indented lines, a trailing "# ..." comment cut, "\" continuations joined; the
# pip line is the set-up's, checked here instead of run.
mapfile -t commands < <("$venv/python3" - "$root/README.md" <<'EOF'
import re, sys
text = open(sys.argv[1], encoding="utf-8").read()
section = text.split("\n## Your own images\n", 1)[1].split("\n## ", 1)[0]
lines, command = [], ""
for line in section.splitlines():
    if not line.startswith("    "):
        continue
    line = re.sub(r"\s+#\s.*$", "", line.strip())
    command += line.removesuffix("\\").rstrip() + " "
    if not line.endswith("\\"):
        lines.append(" ".join(command.split()))
        command = ""
print("\n".join(c for c in lines if c and not c.startswith("pip install")))
EOF
)
"$venv/python3" -c 'import PIL, onnx, onnxruntime, safetensors, matplotlib' 2>/dev/null || {
    echo "own_images.sh: the section needs the images extra: $("$venv/python3" -c 'from minibp import extras; print(extras.install_command("images"))')" >&2
    exit 2
}
cpu="$(grep -q avx512f /proc/cpuinfo && echo 'an Intel Xeon with AVX-512' || echo 'a CPU without AVX-512')"
cd "$work"
export PATH="$venv:$PATH"
start=$SECONDS
for command in "${commands[@]}"; do
    echo "\$ $command"
    began=$SECONDS
    bash -c "$command"
    echo "  ($((SECONDS - began)) s)"
done
total=$((SECONDS - start))
printf 'the section ran in %d:%02d on %s cores of %s\n' $((total / 60)) $((total % 60)) "$(nproc)" "$cpu"
