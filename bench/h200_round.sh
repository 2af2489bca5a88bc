#!/usr/bin/env bash
# The measurements waiting for the H200 (issues 24 and 27), in parts that each fit one
# device call (600 s): every kernel form and option built without a GPU since the last
# measurement, each against its A/B switch in the same run, and the peers in the same run.
#
#   run(command="source .device/env.sh; bash bench/h200_round.sh 1", carry=[".device"])
#
# Each part writes its commands' output to $OUT/h200_round_PART_*.txt (or ./h200_round/ where
# $OUT is unset) and goes on past a failing command. Part 2 also builds llama.cpp's CUDA
# llama-bench from .device/lc/llamacpp-src.tar.xz (bench/llama_cpp_cuda.sh; about 300 s on
# the 16 cores) while webgrad's own benches run on the GPU.
set -uo pipefail
part=${1:?usage: h200_round.sh PART (1-4)}
out=${OUT:-h200_round}
mkdir -p "$out"
py=${PYTHON:-python3}

step() {   # step NAME COMMAND...: run it, its output to a file and to the log
    local name=$1; shift
    echo "== $name: $*"
    "$@" 2>&1 | tee "$out/h200_round_${part}_${name}.txt" | tail -40
}

case $part in
1)  # Llama-3.2-1B-shaped decode: the types against transformers fp32 / bf16, then webgrad's
    # decode forms one at a time (fusion rules 8 and 9, the q rope read by the attention,
    # the int8-activation quantized product)
    step decode "$py" bench/llama_decode.py --types F32,F16,Q4_K_M --profile 25 --exact-timestamps
    step q8dot "$py" bench/llama_decode.py --types Q4_K_M --no-torch --set gemv_q8_dot=True --profile 25 --exact-timestamps
    step no_rows "$py" bench/llama_decode.py --types Q4_K_M --no-torch --set write_rows_epilogue=False
    step no_prologue "$py" bench/llama_decode.py --types Q4_K_M --no-torch --set gemv_prologue=False
    step no_qexpr "$py" bench/llama_decode.py --types Q4_K_M --no-torch --set attn_q_expr=False
    ;;
2)  # llama.cpp's CUDA decode on the same Q4_K_M file, built while GPT-2's decode rows run
    bash bench/llama_cpp_cuda.sh .device/lc/llamacpp-src.tar.xz /tmp/lcb > "$out/h200_round_2_build.txt" 2>&1 &
    build=$!
    step gpt2_decode "$py" bench/gpt2_decode.py --dtypes f32,f16 --peers fp32,bf16
    step gpt2_decode_no_rows "$py" bench/gpt2_decode.py --dtypes f32,f16 --set write_rows_epilogue=False
    wait $build
    step llama_cpp "$py" bench/llama_decode.py --types Q4_K_M --no-torch --llama-bench /tmp/lcb/build/bin/llama-bench
    ;;
3)  # GPT-2 training in precision="mixed": attention fused under mixed against unfused, and
    # the medium row, against torch bf16 autocast in the same run
    step train "$py" bench/gpt2_train.py --rows gpt2 --precision mixed,f32 --peers bf16,fp32 --track 3 --profile 0
    step train_unfused "$py" bench/gpt2_train.py --rows gpt2 --precision mixed --no-torch --set attn_mixed=False --profile 0
    step medium "$py" bench/gpt2_train.py --rows medium --precision mixed --peers bf16 --track 2 --profile 0
    step medium_unfused "$py" bench/gpt2_train.py --rows medium --precision mixed --no-torch --set attn_mixed=False --profile 0
    ;;
4)  # the f16 matmul's tilings, the LoRA step's thin products, the bf16 load
    step mma_sweep "$py" bench/matmul_f16.py --sweep
    step lora "$py" bench/lora_step.py --rows 1b
    step lora_split "$py" bench/lora_step.py --rows 1b --no-torch --set split_thin=0
    step lora_layout "$py" bench/lora_step.py --rows 1b --no-torch --set thin_grads=False
    step lora_lowrank "$py" bench/lora_step.py --rows 1b --no-torch --set lowrank_epilogue=False
    step load "$py" bench/llama_load.py bf16 --runs 2
    ;;
*)  echo "h200_round.sh: PART is 1, 2, 3 or 4" >&2; exit 2 ;;
esac
