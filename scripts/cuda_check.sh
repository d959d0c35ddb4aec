#!/bin/bash
# Runs on a CUDA machine, from the repository's root, with the parts that scripts/cuda_payload.sh made: p1 and
# p2 copied earlier to /root/mlxparts (they do not fit beside the tree in one transfer), p3 in .whl/.
# Writes its logs to $OUT (or ./cuda-out): the reference tests on MLX's CUDA backend, then the bench's rows.
# TESTS_S and BENCH_S bound each part in seconds; ROWS names the bench's rows. docs/cuda.md has the findings.
set -u
OUT=${OUT:-$PWD/cuda-out}; mkdir -p "$OUT"
T0=$(date +%s)
el() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
mkdir -p /tmp/site && cat /root/mlxparts/p1 /root/mlxparts/p2 .whl/p3 | xz -d -T8 | tar x -C /tmp/site \
  || { echo "the parts did not unpack: send p1 and p2 again"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD MLXCHAT_BLAS=reference PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env.txt"
python3 -c "import mlxcore, mlx.core as mx, os; from mlxcore import device_profile as d; \
print(mx.__version__, mx.default_device(), d.current(), 'TF32', os.environ.get('MLX_ENABLE_TF32'))" | tee -a "$OUT/env.txt"
el unpacked
timeout 120 python3 bench/studies/cuda_prompt_rows.py 2>&1 | tee "$OUT/prompt_rows.txt"  # docs/cuda.md
# SIGINT: pytest prints its failures so far when the time is up.
timeout -s INT -k 15 "${TESTS_S:-300}" python3 -m pytest -o addopts="" -p no:cacheprovider -n 12 --dist loadfile -q \
  -rfE --tb=short --timeout 120 ${TESTS:-tests/test_gpu_branches.py tests/test_engine.py tests/test_spec_rows.py \
  tests/test_speculative.py tests/test_batch_forward.py tests/test_batch_mirror.py tests/test_batching_runner.py \
  tests/test_kv_paged.py tests/test_rejection.py tests/test_compiled_forward.py tests/test_decode_attention.py \
  tests/test_prefill_forward.py tests/test_kv_quantized.py tests/test_kv_rotating.py tests/test_hybrid_batch.py \
  tests/test_structured_output.py tests/test_embedded_models.py tests/test_block_drafter.py \
  tests/test_paged_attention_reads.py tests/test_kv_model_cache.py tests/test_serve_chat.py} > "$OUT/pytest.log" 2>&1
el "tests: rc $?"
grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | sed 's/ - .*//' | awk -F'::' '{print $1}' | sort | uniq -c
tail -1 "$OUT/pytest.log"
timeout "${BENCH_S:-170}" python3 -m app.cli bench --runs 3 --json "$OUT/bench.json" \
  --only "${ROWS:-decode_vs_mlx_lm,spec_batch2_vs_plain,spec_batch8_vs_plain}" > "$OUT/bench.log" 2>&1
el "bench: rc $?"
grep -E "^[a-z0-9_]+ +[0-9.]+ " "$OUT/bench.log"
