"""The Triton kernels of :mod:`paczero.zo.cuda_directions` (imported only where they are used: Triton is optional).

The definition of the values they compute, and why, is in that module's docstring.
"""
import triton
import triton.language as tl


@triton.jit
def _normals(seed, blk, B: tl.constexpr):
    """The four outputs for counters [B blk, B (blk + 1)): the values at chunk offsets 4 B blk + q B + j."""
    j = (blk * B + tl.arange(0, B)).to(tl.uint32)
    i1, i2, i3, i4 = tl.randint4x(seed, j)
    a = ((i1 >> 8) + 1).to(tl.float32) * 5.9604644775390625e-08
    b = (i2 >> 8).to(tl.float32) * 5.9604644775390625e-08
    c = ((i3 >> 8) + 1).to(tl.float32) * 5.9604644775390625e-08
    d = (i4 >> 8).to(tl.float32) * 5.9604644775390625e-08
    r1 = tl.sqrt_rn(-2.0 * tl.log(a))
    r2 = tl.sqrt_rn(-2.0 * tl.log(c))
    t1 = 6.283185307179586 * b
    t2 = 6.283185307179586 * d
    return r1 * tl.cos(t1), r1 * tl.sin(t1), r2 * tl.cos(t2), r2 * tl.sin(t2)

@triton.jit
def _emit(z, idx, mask, theta_ptr, out1_ptr, out2_ptr, s, MODE: tl.constexpr):
    if MODE == 0:
        tl.store(out1_ptr + idx, z, mask=mask)
    else:
        t = z * s
        base = tl.load(theta_ptr + idx, mask=mask, other=0.0).to(tl.float32)
        tl.store(out1_ptr + idx, (t + base).to(out1_ptr.dtype.element_ty), mask=mask)
        if MODE == 2:
            tl.store(out2_ptr + idx, (base - t).to(out2_ptr.dtype.element_ty), mask=mask)

@triton.jit
def _update_part(theta_ptr, idx, mask, decay):
    acc = tl.load(theta_ptr + idx, mask=mask, other=0.0).to(tl.float32)
    if decay != 1.0:
        acc = acc * decay
    return acc

@triton.jit
def _chunks_kernel(seeds_ptr, first, CH, n_blk, n_rel, theta_ptr, out1_ptr, out2_ptr, s, scales_ptr, K,
                   n_chunks, decay, MODE: tl.constexpr, B: tl.constexpr):
    """Chunks ``first..`` of one direction over ``n_rel`` flat elements from chunk ``first``'s first one,
    where ``theta_ptr``/``out*_ptr`` point; one program per block of 4 B values of a chunk."""
    pid = tl.program_id(0)
    c_rel = pid // n_blk  # the chunk, counted from ``first`` (integer arguments equal to 1 are constants)
    c = first + c_rel
    blk = pid % n_blk
    o0 = blk * (4 * B) + tl.arange(0, B)  # chunk offsets of output 0; output q at o0 + q B
    i0 = c_rel.to(tl.int64) * CH + o0
    m0 = (o0 < CH) & (i0 < n_rel)
    m1 = (o0 + B < CH) & (i0 + B < n_rel)
    m2 = (o0 + 2 * B < CH) & (i0 + 2 * B < n_rel)
    m3 = (o0 + 3 * B < CH) & (i0 + 3 * B < n_rel)
    if MODE == 3:  # update: theta <- fl(fl(theta (1 - decay)) - sum_k fl(z_k s_k)), K directions in turn
        a0 = _update_part(theta_ptr, i0, m0, decay)
        a1 = _update_part(theta_ptr, i0 + B, m1, decay)
        a2 = _update_part(theta_ptr, i0 + 2 * B, m2, decay)
        a3 = _update_part(theta_ptr, i0 + 3 * B, m3, decay)
        for kk in range(K):
            sk = tl.load(scales_ptr + kk)
            z0, z1, z2, z3 = _normals(tl.load(seeds_ptr + kk * n_chunks + c), blk, B)
            a0 = a0 - z0 * sk
            a1 = a1 - z1 * sk
            a2 = a2 - z2 * sk
            a3 = a3 - z3 * sk
        dt = theta_ptr.dtype.element_ty
        tl.store(theta_ptr + i0, a0.to(dt), mask=m0)
        tl.store(theta_ptr + i0 + B, a1.to(dt), mask=m1)
        tl.store(theta_ptr + i0 + 2 * B, a2.to(dt), mask=m2)
        tl.store(theta_ptr + i0 + 3 * B, a3.to(dt), mask=m3)
    else:
        z0, z1, z2, z3 = _normals(tl.load(seeds_ptr + c), blk, B)
        _emit(z0, i0, m0, theta_ptr, out1_ptr, out2_ptr, s, MODE)
        _emit(z1, i0 + B, m1, theta_ptr, out1_ptr, out2_ptr, s, MODE)
        _emit(z2, i0 + 2 * B, m2, theta_ptr, out1_ptr, out2_ptr, s, MODE)
        _emit(z3, i0 + 3 * B, m3, theta_ptr, out1_ptr, out2_ptr, s, MODE)

@triton.jit
def _rows_kernel(seeds_ptr, rows_ptr, per_chunk, row, n_blk, out_ptr, B: tl.constexpr):
    """out[i, :] = z[rows[i], :] (fp32); one program per block of 4 B chunk offsets that meets the row."""
    pid = tl.program_id(0)
    i = pid // n_blk
    r = tl.load(rows_ptr + i)
    c = r // per_chunk
    start = (r - c * per_chunk) * row  # the row's first offset in its chunk
    blk = start // (4 * B) + pid % n_blk
    z0, z1, z2, z3 = _normals(tl.load(seeds_ptr + c), blk, B)
    col = blk * (4 * B) + tl.arange(0, B) - start
    dst = out_ptr + i.to(tl.int64) * row
    tl.store(dst + col, z0, mask=(col >= 0) & (col < row))
    tl.store(dst + col + B, z1, mask=(col + B >= 0) & (col + B < row))
    tl.store(dst + col + 2 * B, z2, mask=(col + 2 * B >= 0) & (col + 2 * B < row))
    tl.store(dst + col + 3 * B, z3, mask=(col + 3 * B >= 0) & (col + 3 * B < row))
