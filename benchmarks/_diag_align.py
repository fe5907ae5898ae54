# The pre-fix _view3 (no head-stride alignment), on test_attention's FP8 shape 0: does the kernel fail?
import sys, torch
sys.path.insert(0, "tests")
from utils import poisoned
import fmha
from fmha.kernels import forward_sm90
def old_view3(t):
    b, s, h, d = t.shape
    sb, ss, sh, sd = t.stride()
    el = t.element_size()
    if sd != 1 or (el * sb) % 16 or (el * ss) % 16 or t.data_ptr() % 16 or (h > 1 and sh < d):
        return None
    return [b, s, (h - 1) * sh + d], [sb, ss, 1]
forward_sm90._view3 = old_view3
torch.manual_seed(0)
FP8 = torch.float8_e4m3fn
q = poisoned((2, 1000, 16, 128), 1000, FP8, "cuda", scale=3.0)
k = poisoned((2, 1500, 4, 128), 1500, FP8, "cuda", scale=3.0)
v = poisoned((2, 1500, 4, 128), 1500, FP8, "cuda", scale=3.0)
print("gluon takes it:", forward_sm90.supported(q, k, v) is not None, "head stride bytes", q.stride(2))
try:
    out = fmha.attention(q, k, v, causal=True)
    torch.cuda.synchronize()
    ref = fmha.reference.attention_ref(q, k, v, causal=True)[0]
    print("ran; max abs err", (out.float() - ref).abs().max().item())
except Exception as e:
    print("failed:", type(e).__name__, str(e)[:300])
