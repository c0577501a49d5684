#!/usr/bin/env bash
# On the CPU machine, after `VERIFY=... bash scripts/device.sh` ran on the device: file what came
# back under bench/ for the coordinator to commit (`make device-commit OUT="DIR..." [V=v23]`).
#
#   bash scripts/device_commit.sh DIR...   (the device tool's files_at folder of each call)
#
# The verify logs (verify-all.log, or verify-tests.log and verify-rest.log) must all name the same
# commit on their first line. They become one log, bench/DAY-CARD-V-verify.log (CARD: h100 or h200, from
# the logs' nvidia-smi line, else $CARD): that commit line,
# the parts in order, and one summary table of every part's rows at the end. bench.json,
# bench.png and bench.txt become bench/DAY-CARD-V.json, .png and -bench.txt. The files they
# replace (tracked files under bench/ matching OLD, by default version 20's png and bench text and
# the version 21 device log; version 20's json stays: the timing model is calibrated on it and
# tests read it) are `git rm`ed and the new ones `git add`ed; nothing is
# committed. DAY: today (UTC) unless set.
set -euo pipefail
die() { echo "error: $*" >&2; exit 2; }
[ $# -ge 1 ] || die "give the folders the device calls returned: make device-commit OUT=\"DIR1 DIR2\""
V=${V:-v23}
DAY=${DAY:-$(date -u +%F)}
OLD=${OLD:--v20(\.png|-bench\.txt)$|-v21-}
[[ "$V" =~ ^[A-Za-z0-9._-]+$ ]] || die "V=$V: give a version tag of letters, digits, '.', '_', '-' (e.g. v23)"

logs=()
for d in "$@"; do
  [ -d "$d" ] || die "$d is not a folder (give the device tool's files_at folder)"
  for part in all tests rest; do
    [ -f "$d/verify-$part.log" ] && logs+=("$d/verify-$part.log")
  done
done
[ ${#logs[@]} -gt 0 ] || die "no verify-all.log, verify-tests.log or verify-rest.log in: $*"
first=$(head -1 "${logs[0]}")
[[ "$first" =~ ^commit\ [0-9a-f]{40}$ ]] ||
  die "${logs[0]} starts with '$first', not 'commit <40 hex digits>' (was make device-prep run?)"
for f in "${logs[@]}"; do
  [ "$(head -1 "$f")" = "$first" ] || die "$f names $(head -1 "$f"), ${logs[0]} $first: one commit, please"
done
hash=${first#commit }

find_one() {  # the one file NAME among the folders, or nothing
  local hits=() d
  for d in "$@"; do [ -f "$d/$NAME" ] && hits+=("$d/$NAME"); done
  [ ${#hits[@]} -le 1 ] || die "$NAME came back from more than one call: ${hits[*]}"
  [ ${#hits[@]} = 0 ] || echo "${hits[0]}"
}

# The card in the file names: what nvidia-smi said on the logs' "verify PART: NAME, driver" line
# (h100, h200), or CARD.
card=${CARD:-$(grep -m1 -E '^verify [a-z]+: ' "${logs[0]}" | grep -o -i -E '\bH[0-9]{3}\b' | head -1 | tr 'A-Z' 'a-z')}
[[ "$card" =~ ^[a-z][a-z0-9]*$ ]] || die "no card name (H100, H200) on ${logs[0]}'s nvidia-smi line; set CARD=h100 or CARD=h200"
base=bench/$DAY-$card-$V
mkdir -p bench
tmp=$(mktemp "$base.verify.log.XXXX")
{
  echo "$first"
  for f in "${logs[@]}"; do
    echo
    echo "######## $(basename "$f")"
    tail -n +2 "$f"
  done
  echo
  echo "==== summary (every part) ===="
  printf '%-9s %-50s %-6s %5s  %s\n' group step result time detail
  for f in "${logs[@]}"; do
    sed -n '/^==== summary ====$/,$p' "$f" | tail -n +3 | grep -v '^verify '
  done
  for f in "${logs[@]}"; do grep '^verify [a-z]*: [0-9]* rows' "$f" || echo "$(basename "$f"): no summary (cut off?)"; done
} > "$tmp"
mv "$tmp" "$base-verify.log"
new=("$base-verify.log")

for pair in bench.json:.json bench.png:.png bench.txt:-bench.txt; do
  NAME=${pair%%:*}
  src=$(find_one "$@")
  if [ -z "$src" ]; then
    echo "note: no $NAME came back; bench/ keeps the previous one"
    continue
  fi
  cp "$src" "$base${pair#*:}.tmp" && mv "$base${pair#*:}.tmp" "$base${pair#*:}"
  new+=("$base${pair#*:}")
done

mapfile -t old < <(git ls-files bench/ | grep -E -- "$OLD" | grep -v -F -x -f <(printf '%s\n' "${new[@]}") || true)
[ ${#old[@]} = 0 ] || git rm -q -- "${old[@]}"
git add -- "${new[@]}"
if git merge-base --is-ancestor "$hash" HEAD 2>/dev/null; then
  where="HEAD or an ancestor of it"
else
  where="NOT in this checkout's history"
fi
echo "commit $hash: $where"
echo "added: ${new[*]}"
echo "removed: ${old[*]:-nothing}"
grep -h '^verify [a-z]*: [0-9]* rows' "${logs[@]}" || true
echo "next: read $base-verify.log's summary, then git commit (and update the docs that cite bench/)"
