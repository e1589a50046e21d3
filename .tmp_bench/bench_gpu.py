import time, torch, sys
sys.path.insert(0, '.')
torch.set_num_threads(int(sys.argv[1]))
from reference.attention import sparse_mla_decode, sparse_mla_prefill
from reference.layouts import quantize_v32, quantize_v4
g=torch.Generator().manual_seed(0)
dev=sys.argv[2]
def best(f, n=3):
    f(); torch.cuda.synchronize() if dev=='cuda' else None; ts=[]
    for _ in range(n):
        t=time.perf_counter(); f(); torch.cuda.synchronize() if dev=='cuda' else None; ts.append(time.perf_counter()-t)
    return min(ts), sorted(ts)[n//2]
N=65536
cache = quantize_v32(torch.randn(N,576,generator=g), 64).to(dev)
q = torch.randn(64,1,128,576,generator=g).bfloat16().to(dev)
idx = torch.randint(0,N,(64,1,2048),dtype=torch.int32,generator=g).to(dev)
b,m = best(lambda: sparse_mla_decode(q, cache, idx, 576**-0.5))
fl=2*64*128*2048*1088
print(f"threads {sys.argv[1]} decode V3.2 b64 h128 topk2048: best {b:.3f}s median {m:.3f}s ({fl/b/1e9:.0f} GFLOP/s)")
cache4 = quantize_v4(torch.randn(N,512,generator=g).to(dev), 256)
q4 = torch.randn(64,1,64,512,generator=g).bfloat16().to(dev)
i4 = torch.randint(0,N,(64,1,512),dtype=torch.int32,generator=g).to(dev)
e4 = torch.randint(0,N,(64,1,128),dtype=torch.int32,generator=g).to(dev)
b,m = best(lambda: sparse_mla_decode(q4, cache4, i4, 512**-0.5, attn_sink=torch.zeros(64,device=dev), extra_k_cache=cache4, extra_indices=e4))
print(f"threads {sys.argv[1]} decode V4 b64 h64 topk512+extra128 sink: best {b:.3f}s median {m:.3f}s")
kv = torch.randn(32768,1,512,generator=g).bfloat16().to(dev)
qp = torch.randn(4096,64,512,generator=g).bfloat16().to(dev)
ip = torch.randint(0,32768,(4096,1,640),dtype=torch.int32,generator=g).to(dev)
b,m = best(lambda: sparse_mla_prefill(qp, kv, ip, 512**-0.5), 2)
fl=2*4096*64*640*1024
print(f"threads {sys.argv[1]} prefill s_q4096 h64 topk640 d512: best {b:.2f}s median {m:.2f}s ({fl/b/1e9:.0f} GFLOP/s)")
