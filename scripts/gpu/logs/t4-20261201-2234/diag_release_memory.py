"""Diagnosis: what keeps notebook 07's script model on the GPU after `del model, trainer`."""
import json, sys, weakref, gc, re
nb=json.load(open('notebooks/07_complete_recipe.ipynb'))
ns={"__name__":"__main__","display":print}
for i,c in enumerate(nb['cells']):
    if c['cell_type']=='code' and i in (4,8):
        src=re.sub(r"^USE_LLAMA_8B = False","USE_LLAMA_8B = True",''.join(c['source']),flags=re.M)
        exec(compile(src,f'cell{i}','exec'),ns)
import torch
m=ns['model']; base=m.get_base_model()
w=weakref.ref(base); wt=weakref.ref(ns['trainer']); wo=weakref.ref(ns['trainer'].optimizer)
emb=weakref.ref(base.get_input_embeddings().weight)
del m, base
for k in ('model','trainer'): ns.pop(k)
from course_utils.hardware import release_memory
print("clearCublasWorkspaces:", hasattr(torch._C, "_cuda_clearCublasWorkspaces")); held=release_memory()
print(f"held {held/2**30:.2f} GiB reserved, {torch.cuda.memory_allocated()/2**30:.2f} GiB allocated")
print("base alive:", w() is not None, "trainer alive:", wt() is not None, "optimizer alive:", wo() is not None, "embedding alive:", emb() is not None)
segs=[s for s in torch.cuda.memory_snapshot() if any(b['state']=='active_allocated' for b in s['blocks'])]
for s in sorted(segs,key=lambda s:-s['total_size'])[:10]:
    act=[b['size'] for b in s['blocks'] if b['state']=='active_allocated']
    print(f"segment {s['total_size']/2**20:.1f} MiB, {len(act)} active blocks, {sum(act)/2**20:.2f} MiB active, largest {max(act)/2**20:.2f} MiB")
big=[o for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.is_cuda]
big.sort(key=lambda t:-t.untyped_storage().nbytes())
for t in big[:8]:
    print("live tensor", tuple(t.shape), t.dtype, t.untyped_storage().nbytes()/2**20, "MiB", type(t).__name__)
def chain(obj, depth=0, seen=None):
    seen = seen if seen is not None else set()
    for r in gc.get_referrers(obj):
        if id(r) in seen or type(r).__name__ in ('frame','list_iterator') : continue
        seen.add(id(r))
        desc = type(r).__name__
        if isinstance(r, dict): desc += str([k for k,v in r.items() if v is obj][:3])
        print("  "*depth, desc, str(getattr(r,'__qualname__', ''))[:80], flush=True)
        if depth<5: chain(r, depth+1, seen)
for name, ref in (("trainer", wt), ("base", w), ("optimizer", wo), ("embedding", emb)):
    if ref() is not None:
        print("referrers of", name); chain(ref()); break
if big and not any(r() is not None for r in (wt,w,wo,emb)):
    print("referrers of the largest live tensor"); chain(big[0])
