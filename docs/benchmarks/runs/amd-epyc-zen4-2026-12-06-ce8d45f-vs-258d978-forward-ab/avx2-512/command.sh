#!/usr/bin/env bash
set -euo pipefail
cd /work/main
A=/work/base-target/release/layad-bench; B=/work/exp/binA/layad-bench; O=/work/exp/avx2-512; mkdir -p $O
i=0
for side in A B B A A B B A; do
  i=$((i+1)); bin=$A; [ $side = B ] && bin=$B
  $bin --out-dir /work/bench --models modernbert-large --lengths 512 --rows 1 --precisions f32 --cpu-kernels avx2,auto --python none --min-runs 3 --max-runs 3 --threads 2 --json $O/run-$i-$side.json > /dev/null 2>&1
  python3 -c "
import json; d=json.load(open('$O/run-$i-$side.json')); print('$side', [(c['engine'], round(c['p50_ms'],1)) for c in d['cells']])"
done
