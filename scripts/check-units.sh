#!/usr/bin/env bash
# Check every systemd unit under deploy/ (or DIR) with `systemd-analyze verify` (CI runs this).
#
#   scripts/check-units.sh [DIR]      exit 0: all clean, or "skipped: ..." when systemd-analyze is missing
#
# verify checks that each Exec*= program exists, but those are installed on the nodes and servers, not on
# the CI machine. So the units are verified inside a scratch root: this machine's own unit directories (for
# network-online.target, modprobe@.service, ...) plus an empty executable at every absolute Exec*= path.
# Any line verify prints (unknown keys and bad values are only warnings to it) fails the check.
set -euo pipefail

if ! command -v systemd-analyze >/dev/null 2>&1; then
    echo "skipped: systemd-analyze is not installed (Debian: apt-get install systemd)"
    exit 0
fi
units_dir=${1:-$(cd "$(dirname "$0")/.." && pwd)/deploy}
shopt -s nullglob
units=("$units_dir"/*.service "$units_dir"/*.timer "$units_dir"/*.socket)
if [ ${#units[@]} -eq 0 ]; then
    echo "error: no units under $units_dir" >&2
    exit 1
fi

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/usr/lib/systemd" "$root/etc/systemd/system"
for dir in /usr/lib/systemd/system /lib/systemd/system; do
    if [ -d "$dir" ] && [ ! -e "$root/usr/lib/systemd/system" ]; then
        cp -r "$dir" "$root/usr/lib/systemd/system"
    fi
done

# The program of every Exec*= line, without systemd's prefixes (-, @, :, +, !).
executables() {
    sed -n -E 's/^Exec[A-Za-z]*=[-@:+!]*([^[:space:]]+).*/\1/p' "$1"
}

status=0
for unit in "${units[@]}"; do
    cp "$unit" "$root/etc/systemd/system/"
    for program in $(executables "$unit"); do
        if [[ $program == /* ]]; then
            mkdir -p "$root$(dirname "$program")"
            printf '#!/bin/sh\n' > "$root$program"
            chmod +x "$root$program"
        fi
    done
done
for unit in "${units[@]}"; do
    name=$(basename "$unit")
    if output=$(systemd-analyze verify --man=no --root="$root" "$name" 2>&1) && [ -z "$output" ]; then
        echo "ok: $name"
    else
        echo "FAILED: $name"
        printf '%s\n' "${output:-systemd-analyze verify failed without a message}" | sed "s|$root||g"
        status=1
    fi
done
exit $status
