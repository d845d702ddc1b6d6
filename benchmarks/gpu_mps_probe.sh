#!/bin/bash
# Issue #48 (thirtieth session): what MPS client priority, the SM limit and quit do to other clients, torch only (no
# vLLM, no Ray; the image's torch), each client bounded by timeout. Prints one line per probe. Probes 1-7 ran on one
# H100 (benchmarks/results/s30_mps_priority_probe.txt); 8-11 (a decode-like client: a bf16 weight stream for 64
# sequences, memory-bound as a replica's decode step is, beside a busy trainer-like client) and the sweep 12-13 (each
# limit on a trainer-like client: the decode-like client beside it busy, and the other way round, for
# reasonrl.bench.mps_probe.overlap_shares) on another H100 in the thirty-first session
# (benchmarks/results/s31_mps_probe.{txt,json}; the sweep there as three calls of the same commands).
#   bash benchmarks/gpu_mps_probe.sh   (PY: the Python to use, the H200 image's /opt/torch/.venv by default; the
#                                       output also as $OUT/gpu_mps_probe.json, by reasonrl/bench/mps_probe.py)
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mpsprobe/p CUDA_MPS_LOG_DIRECTORY=/tmp/mpsprobe/l
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
P=${PY:-/opt/torch/.venv/bin/python}
WORK="import torch,time,sys;a=torch.randn(4096,4096,device='cuda');torch.cuda.synchronize();t=time.time();[a@a for _ in range(400)];torch.cuda.synchronize();print(sys.argv[1],'400 matmuls s',round(time.time()-t,3),flush=True)"
work(){ timeout 40 env "$@" $P -c "$WORK" "$*" 2>&1 | tail -1; }
hold(){ timeout 45 env "$@" $P -c "import torch,time,sys;a=torch.randn(4096,4096,device='cuda');torch.cuda.synchronize();print('holder up',flush=True);open('/tmp/mpsprobe/up','w');
t=time.time()
while time.time()-t<float(sys.argv[1]): a@a
torch.cuda.synchronize()" $SECS 2>&1 | tail -1; }
DECODE="import torch,time,sys;w=torch.randn(16384,16384,device='cuda',dtype=torch.bfloat16);x=torch.randn(16384,64,device='cuda',dtype=torch.bfloat16);torch.cuda.synchronize();t=time.time();[w@x for _ in range(5000)];torch.cuda.synchronize();s=time.time()-t;print(sys.argv[1],'5000 decode-like steps s',round(s,3),'weight GB/s',round(5000*w.numel()*2/s/1e9),flush=True)"
decode(){ timeout 60 env "$@" $P -c "$DECODE" "$*" 2>&1 | tail -1; }
hold_decode(){ timeout 45 $P -c "import torch,time;w=torch.randn(16384,16384,device='cuda',dtype=torch.bfloat16);x=torch.randn(16384,64,device='cuda',dtype=torch.bfloat16);torch.cuda.synchronize();open('/tmp/mpsprobe/up','w')
t=time.time()
while time.time()-t<12: w@x
torch.cuda.synchronize()" 2>&1 | tail -1; }
LIMITS=("normal A=1" "low CUDA_MPS_CLIENT_PRIORITY=1" "sm80 CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=80"
        "sm70 CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=70" "sm60 CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=60"
        "sm60_low CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=60 CUDA_MPS_CLIENT_PRIORITY=1"
        "sm50 CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50" "sm40 CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40")
up(){ for i in $(seq 200); do [ -f /tmp/mpsprobe/up ] && break; sleep 0.1; done; rm -f /tmp/mpsprobe/up; }  # the holder wrote it
rm -f /tmp/mpsprobe/up
run_probes() {
nvidia-cuda-mps-control -d
echo "== 1 solo normal"; work A=solo
echo "== 2 idle below-normal client started the server first, then normal works"
SECS=0 ; ( timeout 45 env CUDA_MPS_CLIENT_PRIORITY=1 $P -c "import torch,time;x=torch.ones(1,device='cuda');torch.cuda.synchronize();open('/tmp/mpsprobe/up','w');time.sleep(15)" ) & up; work A=beside_idle_low; wait
echo "== 3 busy below-normal beside normal"; SECS=12 hold CUDA_MPS_CLIENT_PRIORITY=1 & up; work A=beside_busy_low; wait
echo "== 4 busy normal beside normal"; SECS=12 hold A=1 & up; work A=beside_busy_normal; wait
echo "== 5 busy normal beside below-normal worker"; SECS=12 hold A=1 & up; work A=low_beside_busy_normal CUDA_MPS_CLIENT_PRIORITY=1; wait
echo "== 6 busy sm60 beside normal"; SECS=12 hold CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=60 & up; work A=beside_busy_sm60; wait
echo "== 7 a client after quit while one holds"; SECS=8 hold A=1 & up; echo quit | nvidia-cuda-mps-control; work A=after_quit; wait
sleep 2; echo "== daemon after 7: $(echo get_server_list | nvidia-cuda-mps-control 2>&1 | head -1)"
nvidia-cuda-mps-control -d
echo "== 8 decode solo"; decode A=decode_solo
echo "== 9 decode beside busy normal"; SECS=20 hold A=1 & up; decode A=decode_beside_busy_normal; wait
echo "== 10 decode beside busy sm60"; SECS=20 hold CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=60 & up; decode A=decode_beside_busy_sm60; wait
echo "== 11 decode beside busy below-normal"; SECS=20 hold CUDA_MPS_CLIENT_PRIORITY=1 & up; decode A=decode_beside_busy_low; wait
for entry in "${LIMITS[@]}"; do  # 12: the decode-like client beside a busy trainer-like one under the limit; 13: back
  set -- $entry; name=$1; shift
  echo "== 12 decode beside busy $name"; SECS=15 hold "$@" & up; decode A=decode_beside_busy_$name; wait
  echo "== 13 $name beside busy decode"; hold_decode & up; work "$@" A=${name}_beside_busy_decode; wait
done
echo quit | nvidia-cuda-mps-control; sleep 2; echo "== daemon at the end: $(echo get_server_list | nvidia-cuda-mps-control 2>&1 | head -1)"
tail -5 $CUDA_MPS_LOG_DIRECTORY/control.log
}
mkdir -p "${OUT:-.}"
run_probes 2>&1 | tee /tmp/mpsprobe/output.txt
$P -m reasonrl.bench.mps_probe /tmp/mpsprobe/output.txt "${OUT:-.}/gpu_mps_probe.json"
