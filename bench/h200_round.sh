#!/usr/bin/env bash
# The measurements waiting for the H200 (issues 24 and 27), in parts that each fit one
# device call (600 s): every kernel form and option built without a GPU since the last
# measurement, each against its A/B switch in the same run, and the peers in the same run.
#
#   run(command="source .device/env.sh; bash bench/h200_round.sh 1", carry=[".device"])
#
# Each part writes its commands' output to $OUT/h200_round_PART_*.txt (or ./h200_round/ where
# $OUT is unset) and goes on past a failing command. Part 1 also builds llama.cpp's CUDA
# llama-bench from .device/lc/llamacpp-src.tar.xz (bench/llama_cpp_cuda.sh; about 300 s on
# the 16 cores) while webgrad's own benches run on the GPU.
set -uo pipefail
part=${1:?usage: h200_round.sh PART (1-11)}
out=${OUT:-h200_round}
mkdir -p "$out"
py=${PYTHON:-python3}

step() {   # step NAME SECONDS COMMAND...: run it (stopped after SECONDS), its output to a file and to the log
    local name=$1 secs=$2; shift 2
    echo "== $name (at most ${secs} s): $*"
    timeout -k 5 "$secs" "$@" 2>&1 | tee "$out/h200_round_${part}_${name}.txt" | tail -40
}

# each part's limits add up to under a device call's 600 s, the most telling step first
case $part in
1)  # Llama-3.2-1B-shaped decode: the types against transformers fp32 / bf16, llama.cpp's CUDA
    # build on the same Q4_K_M file (built meanwhile), the int8-activation quantized product
    bash bench/llama_cpp_cuda.sh .device/lc/llamacpp-src.tar.xz /tmp/lcb > "$out/h200_round_1_build.txt" 2>&1 &
    build=$!
    step decode 230 "$py" bench/llama_decode.py --types F32,F16,Q4_K_M --profile 25 --exact-timestamps
    step q8dot 90 "$py" bench/llama_decode.py --types Q4_K_M --no-torch --set gemv_q8_dot=True --profile 25 --exact-timestamps
    wait $build
    step llama_cpp 120 "$py" bench/llama_decode.py --types Q4_K_M --no-torch --llama-bench /tmp/lcb/build/bin/llama-bench
    step llama_cpp_q8dot 90 "$py" bench/llama_decode.py --types Q4_K_M --no-torch --set gemv_q8_dot=True --llama-bench /tmp/lcb/build/bin/llama-bench
    ;;
2)  # GPT-2 training in precision="mixed" against torch bf16 autocast in the same run, the
    # medium row, fused attention under mixed against unfused; GPT-2's f16 decode
    step train 190 "$py" bench/gpt2_train.py --rows gpt2 --precision mixed,f32 --peers bf16,fp32 --track 3 --profile 0
    step medium 170 "$py" bench/gpt2_train.py --rows medium --precision mixed --peers bf16 --track 2 --profile 0
    step gpt2_decode 120 "$py" bench/gpt2_decode.py --dtypes f32,f16 --peers fp32,bf16
    step train_unfused 80 "$py" bench/gpt2_train.py --rows gpt2 --precision mixed --no-torch --set attn_mixed=False --profile 0
    ;;
3)  # the LoRA step's forms, the f16 matmul's tilings, the bf16 load, the decode A/Bs
    step lora 150 "$py" bench/lora_step.py --rows 1b
    step lora_lowrank 90 "$py" bench/lora_step.py --rows 1b --no-torch --set lowrank_epilogue=False
    step mma_sweep 150 "$py" bench/matmul_f16.py --sweep
    step load 80 "$py" bench/llama_load.py bf16 --runs 2
    step no_rows 90 "$py" bench/gpt2_decode.py --dtypes f32,f16 --set write_rows_epilogue=False
    ;;
4)  # after parts 1-3 (2026-12-04): the mixed step's profile with attention unfused, the
    # medium row unfused, the LoRA step's other forms with the low-rank epilogue off, the
    # f16 matmul's 4-half copies combined with the other fields
    step train_profile 110 "$py" bench/gpt2_train.py --rows gpt2 --precision mixed --peers bf16 --set attn_mixed=False --profile 30
    step medium_unfused 150 "$py" bench/gpt2_train.py --rows medium --precision mixed --peers bf16 --set attn_mixed=False --profile 15
    step lora_profile 80 "$py" bench/lora_step.py --rows 1b --no-torch --set lowrank_epilogue=False --profile 30
    step lora_split 60 "$py" bench/lora_step.py --rows 1b --no-torch --set lowrank_epilogue=False --set split_thin=0
    step lora_layout 60 "$py" bench/lora_step.py --rows 1b --no-torch --set lowrank_epilogue=False --set thin_grads=False
    step mma_w4 70 "$py" bench/matmul_f16.py --shapes 4096x4096x4096,4096x768x3072 --tilings 128x128x32:2x2:w4,128x128x32:2x2:row:w4,128x128x32:2x2:sw8:w4,128x256x32:2x4:w4,128x128x16:2x2:w4,128x128x32:2x2:peel:w4,128x128x32:2x2:w2,128x128x32:2x2 --robustness off
    ;;
5)  # (2026-12-04, later) attention on subgroup matrices: its check against the unfused mixed
    # program and torch's flash attention, then the mixed steps with it (the default) and
    # without (attn_mma=False: unfused)
    step attn_mma 150 "$py" bench/attention_mma.py
    step train 150 "$py" bench/gpt2_train.py --rows gpt2 --precision mixed --peers bf16 --track 2 --profile 0
    step train_unfused 70 "$py" bench/gpt2_train.py --rows gpt2 --precision mixed --no-torch --set attn_mma=False --profile 0
    step medium 180 "$py" bench/gpt2_train.py --rows medium --precision mixed --peers bf16 --track 1 --steps 6 --profile 0
    ;;
6)  # the rank-r products' tiles (expand_k, thin_split) and the LoRA step with them on and off
    step thin 200 "$py" bench/thin_products.py
    step lora_on 90 "$py" bench/lora_step.py --rows 1b --no-torch
    step lora_off 90 "$py" bench/lora_step.py --rows 1b --no-torch --set expand_k=0 --set thin_split=0
    step lora_thin 80 "$py" bench/lora_step.py --rows 1b --no-torch --set expand_k=0
    step lora_expand 80 "$py" bench/lora_step.py --rows 1b --no-torch --set thin_split=0
    ;;
7)  # (2026-12-04, close) the mixed steps with today's main: attention unfused (the default)
    # and on subgroup matrices (attn_mixed=True), each against torch bf16 in the same run
    step attn_mma 100 "$py" bench/attention_mma.py --shapes 8x12x512x64,8x16x1024x64
    step train 130 "$py" bench/gpt2_train.py --rows gpt2 --precision mixed --peers bf16 --track 2 --profile 0
    step train_fused 60 "$py" bench/gpt2_train.py --rows gpt2 --precision mixed --no-torch --set attn_mixed=True --profile 60 --exact-timestamps
    step medium 150 "$py" bench/gpt2_train.py --rows medium --precision mixed --peers bf16 --track 1 --steps 6 --profile 0
    step medium_fused 100 "$py" bench/gpt2_train.py --rows medium --precision mixed --no-torch --steps 6 --set attn_mixed=True --profile 0
    ;;
8)  # (2026-12-04, evening) an epilogue that streams a tensor (GELU's backward, a residual)
    # staged by its own option, mma_epi_load_stage: a whole row (0), one matrix (1, as the
    # other epilogues), two (2); and its loads a round ahead (mma_epi_ahead)
    for v in 0 1 2; do
        step medium_load$v 130 "$py" bench/gpt2_train.py --rows medium --precision mixed --no-torch --steps 6 --set mma_epi_load_stage=$v --profile 12
    done
    step medium_ahead1 130 "$py" bench/gpt2_train.py --rows medium --precision mixed --no-torch --steps 6 --set mma_epi_ahead=True --profile 12
    ;;
9)  # part 8's options on the 124M step, a round ahead at two matrices a round, and the
    # products reading their f16 copies transposed (mma_transposed; the kernel alone first)
    step mma_t 60 "$py" bench/matmul_f16.py --robustness off --no-torch --tilings 128x128x32:2x2,128x128x32:2x2:at,128x128x32:2x2:bt,128x128x32:2x2:at:bt --shapes 4096x4096x4096,768x3072x4096,4096x768x3072
    step medium_ahead2 100 "$py" bench/gpt2_train.py --rows medium --precision mixed --no-torch --steps 6 --set mma_epi_ahead=True --set mma_epi_load_stage=2 --profile 12
    for set in mma_epi_load_stage=1 mma_epi_load_stage=0 mma_epi_ahead=True mma_transposed=True "mma_transposed='weights'"; do
        step "gpt2_$(printf %s "$set" | tr -c 'A-Za-z0-9_' '_')" 60 "$py" bench/gpt2_train.py --rows gpt2 --precision mixed --no-torch --set "$set" --profile 0
    done
    step gpt2_peer 110 "$py" bench/gpt2_train.py --rows gpt2 --precision mixed --peers bf16 --track 2 --profile 0
    ;;
10) # (2026-12-06) the copy transposing a slab into workgroup memory (MmaTiling.a_x / b_x:
    # a subgroup's f16 stores in consecutive words) against today's kernels and torch fp16;
    # then part 9's options on the 124M step, and the peer
    step mma_x 140 "$py" bench/matmul_f16.py --robustness off --shapes 4096x4096x4096,4096x768x3072 --tilings 128x128x32:2x2,128x128x32:2x2:w4,128x128x32:2x2:ax,128x128x32:2x2:bx,128x128x32:2x2:ax:bx,128x128x32:2x2:ax:bx:w4,128x256x32:2x4:ax:bx,256x128x32:4x2:ax:bx,128x128x64:2x2:ax:bx,128x128x32:2x2:at:bt
    for set in mma_xcopy=True mma_transposed=True "mma_transposed='weights'" mma_epi_load_stage=0 mma_epi_ahead=True; do
        step "gpt2_$(printf %s "$set" | tr -c 'A-Za-z0-9_' '_')" 55 "$py" bench/gpt2_train.py --rows gpt2 --precision mixed --no-torch --set "$set" --profile 0
    done
    step gpt2_peer 105 "$py" bench/gpt2_train.py --rows gpt2 --precision mixed --peers bf16 --track 2 --profile 0
    ;;
11) # (2026-12-06, close; not yet run) the rounding transposing copies (now in every mixed
    # step) and mma_transposed's modes: the default (None: True on subgroup matrices, views
    # where they cost no memory) against off and "all", each row against torch bf16 in the
    # same call; set the default back to False if True is not the quicker
    step gpt2_default 100 "$py" bench/gpt2_train.py --rows gpt2 --precision mixed --peers bf16 --track 2 --profile 0
    step gpt2_off 50 "$py" bench/gpt2_train.py --rows gpt2 --precision mixed --no-torch --profile 0 --set mma_transposed=False
    step gpt2_all 50 "$py" bench/gpt2_train.py --rows gpt2 --precision mixed --no-torch --profile 0 --set "mma_transposed='all'"
    step medium_default 170 "$py" bench/gpt2_train.py --rows medium --precision mixed --peers bf16 --track 1 --steps 6 --profile 0
    step medium_off 100 "$py" bench/gpt2_train.py --rows medium --precision mixed --no-torch --steps 6 --profile 0 --set mma_transposed=False
    ;;
*)  echo "h200_round.sh: PART is 1 to 11" >&2; exit 2 ;;
esac
