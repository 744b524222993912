#!/bin/bash
# The mean us/token of each variant per shape and context, from one-launch-time.py logs named
# <shape>_<variant>_<round>.log in directory $1 (ab.sh, kw-sweep.sh): "variant shape ctx mean", sorted by shape,
# context, variant.
for f in "$1"/*_[0-9].log; do
  b=$(basename "$f" .log); t=${b%_*}; t=${t##*_}; s=${b%%_*}
  grep "us/token" "$f" | awk -v t="$t" -v s="$s" '{for (i = 1; i < NF; i++) if ($i == "ctx") print t, s, $(i + 1), $(i + 2)}'
done | awk '{k = $1 " " $2 " " $3; n[k]++; v[k] += $4} END {for (k in n) printf "%s %.1f\n", k, v[k] / n[k]}' | sort -k2,2 -k3,3n -k1,1
