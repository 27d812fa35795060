/* tests/compile_cuda.cu — nvcc compiles lossfuse_cuda.cuh with every primitive instantiated,
 * for each element type, under --Werror all-warnings, for every configured architecture
 * (sm_80 takes the no-cluster branches). Runs nothing on a GPU: exit 0 when it links. */
#include "lossfuse_cuda.cuh"

#include <stdio.h>

/* (The header's quick start, row_lse, and the usage kernels of sections 6 and 8 are compiled
 * and run against the references by tests/test_ce_gpu.cu and tests/test_kl_gpu.cu.) */

/* Every collective, the piece pipeline, the gradient writers and the cluster merge, per dtype. */
template <typename T, bool FULL, bool SOFTCAP>
__global__ void __launch_bounds__(128) everything(T *x, int64_t V, float *out, const float *w, int nranks)
{
    extern __shared__ uint4 buf[];
    __shared__ float fs[4];
    __shared__ double ds[4];
    __shared__ lf_lse ls[4];
    __shared__ lf_row_stats rs[4];
    __shared__ lf_row_stats xchg[2];
    const float v = (float)threadIdx.x;
    float a = lf_warp_sum_f32(v) + lf_warp_max_f32(v);
    a += (float)lf_warp_sum_f64((double)v);
    lf_lse l = lf_lse_init();
    lf_lse_push(&l, v);
    l = lf_warp_lse(l);
    lf_argmax am = lf_argmax_init();
    lf_argmax_push(&am, v, (int32_t)threadIdx.x);
    am = lf_warp_argmax(am);
    a += lf_block_sum_f32<128>(v, fs);
    __syncthreads();
    a += lf_block_max_f32<128>(v, fs);
    a += (float)lf_block_sum_f64<128>((double)v, ds);
    l = lf_block_lse<128>(l, ls);
    const lf_xform t = lf_xform_make(0.5f, SOFTCAP ? 30.0f : 0.0f);
    const int rank = (int)(blockIdx.x % nranks);
    T *row = x + (int64_t)blockIdx.x * V;
    const lf_row_span sp = lf_row_span_make(row, V);
    int beg, end;
    lf_row_slice(sp, rank, nranks, &beg, &end);
    lf_piece_load<128>(buf, row, sp, beg, end);
    lf_cp_async_commit();
    const lf_edge e = lf_row_edge_load(row, sp);
    lf_cp_async_wait<0>();
    lf_row_stats st = lf_row_stats_init();
    lf_edge_stats<FULL, SOFTCAP>(st, e, t, w);
    lf_piece_stats<128, T, FULL, SOFTCAP>(st, buf, sp, beg, end, t, w);
    st = lf_block_row_stats<128>(st, rs);
    st = lf_cluster_row_stats(st, &xchg[0]);
    const float lse = lf_lse_final(st.lse);
    const lf_grad_coef c = lf_grad_coef_make(1.0f, lse, 0.1f, 1e-4f, 1.0f, st.w, V, t);
    lf_edge_grad_store<FULL, SOFTCAP>(row, e, c, t, w);
    lf_piece_grad_store<128, FULL, SOFTCAP>(row, true, buf, sp, beg, end, c, t, w);
    if (lf_row_owner_rank<T>(0, sp, nranks) == rank && threadIdx.x == 0)
        row[0] = lf_elem<T>::from_f32(lf_ce_label_grad<FULL, SOFTCAP>(0.0f, 0, c, t, w));
    lf_cluster_arrive();
    lf_cluster_wait();
    lf_cluster_sync();
    lf_row_zero<128>(row, V, rank, nranks);
    if (threadIdx.x == 0) out[blockIdx.x] = a + lse + lf_lse_entropy(st.lse) + (float)am.i + l.s;
}

/* The fast row pass: packed maximum, lazy argmax, one-barrier and split (mbarrier) merges, the
 * folded-exponent gradient writer, deferred edge loads, element access, per dtype. */
template <typename T, bool FULL>
__global__ void __launch_bounds__(128) fast_path(T *x, int64_t V, float *out)
{
    extern __shared__ uint4 buf[];
    __shared__ float scratch[6 * 128 / 32];
    __shared__ unsigned key;
    __shared__ uint64_t bar;
    T *row = x + (int64_t)blockIdx.x * V;
    const lf_row_span sp = lf_row_span_make(row, V);
    const lf_xform t = lf_xform_make(1.0f, 0.0f);
    if (threadIdx.x == 0) {
        key = lf_argmax_key(-LF_INF_F);
        lf_mbar_init(&bar, 128);
    }
    lf_piece_load<128>(buf, row, sp, 0, sp.nvec);
    lf_cp_async_commit();
    const lf_edge_raw er = lf_row_edge_issue(row, sp);
    lf_cp_async_wait<0>();
    __syncthreads();
    const lf_edge e = lf_edge_resolve<T>(er);
    lf_row_stats st = lf_row_stats_init();
    lf_lazy_argmax la = lf_lazy_argmax_init();
    lf_edge_stats<FULL, false>(st, e, t, NULL);
    lf_piece_stats_fast<128, T, FULL>(st, la, &key, buf, sp, 0, sp.nvec, t, true);
    float xm = fmaxf(la.v, st.am.v);
    int32_t xi = la.i;
    float xs = st.wz;
    lf_lse l = lf_block_lse_fast<128, FULL>(st.lse, &xm, &xi, &xs, scratch);
    __syncthreads();
    lf_block_lse_post<128, FULL>(l, xm, xi, xs, scratch);
    lf_mbar_arrive(&bar);
    lf_mbar_wait(&bar, 0);
    l = lf_block_lse_merge<128, FULL>(&xm, &xi, &xs, scratch);
    lf_grad_coef c = lf_grad_coef_make(1.0f, lf_lse_final(l), 0.0f, 0.0f, 1.0f, (float)V, V, t);
    lf_piece_grad_fast<128, T, false>(row, buf, sp, 0, sp.nvec, t.scale_l2e, lf_grad_fast_k(c));
    lf_piece_grad_fast<128, T, true>(row, buf, sp, 0, sp.nvec, t.scale_l2e, lf_grad_fast_k(c));
    lf_grad_coef_onto_max(c, l.m, l.s); /* p_j against the maximum; fast or exact by lf_grad_fast_ok */
    if (!lf_piece_grad_fast_if_ok<128, T>(row, buf, sp, 0, sp.nvec, c, lf_grad_fast_k(c), t.scale_l2e))
        lf_piece_grad_store<128, false, false>(row, true, buf, sp, 0, sp.nvec, c, t, NULL);
    const float g = lf_elem<T>::get(buf[0], (int)(threadIdx.x % lf_elem<T>::per_vec));
    if (threadIdx.x == 0) out[blockIdx.x] = l.s + xm + (float)xi + xs + g + e.x;
}

/* lossfuse.h's dual state (section 3b) in device code. */
__global__ void dual_state(const float *a, const float *b, int64_t V, float *out)
{
    lf_dual d = lf_dual_init(), e = lf_dual_init();
    for (int64_t j = threadIdx.x; j < V; j += 2 * blockDim.x) lf_dual_push(&d, a[j], b[j]);
    for (int64_t j = threadIdx.x + blockDim.x; j < V; j += 2 * blockDim.x) lf_dual_push(&e, a[j], b[j]);
    const lf_dual_out o = lf_dual_final(lf_dual_merge(d, e));
    float g[7];
    const float h = a[threadIdx.x % V];
    /* and the scalar pair losses (section 3c) */
    const float pl = lf_dpo_sigmoid(h, 0.1f, 0.05f, &g[0]) + lf_dpo_hinge(h, 0.1f, &g[1]) + lf_dpo_ipo(h, 0.1f, &g[2]) +
                     lf_simpo(h, 2.0f, 0.5f, &g[3]) + lf_bt(h, 0.7f, 1.5f, &g[4]) +
                     lf_hinge_margin(h, -1.0f, 0.3f, 1.0f, &g[5]) + lf_log_sigmoid(h) + lf_sigmoid(h);
    g[6] = 0.0f;
    for (int k = 0; k < 6; ++k) g[6] += g[k];
    out[threadIdx.x] = o.kl_fwd + o.kl_rev + o.lse_a + o.ent_b + pl + g[6];
}

/* lossfuse.h sections 10 and 11 in device code: a rank's labels under context parallelism, and
 * one row's vocabulary-parallel shares merged (from memory, from lanes, through flagged slots). */
__global__ void parallel(const int32_t *cu, int64_t nseq, const int64_t *ids, int32_t *labels, const float *x, int64_t V,
                         lf_tp_share *g, lf_tp_slot *slots, float *out)
{
    lf_cp_local_labels_grid(cu, nseq, 2, 1, ids, (const uint8_t *)NULL, -100, labels, (int64_t *)NULL);
    int64_t v0, v1;
    lf_tp_shard(V, (int)blockDim.x, (int)threadIdx.x, &v0, &v1);
    lf_tp_acc acc = lf_tp_acc_init();
    for (int64_t j = v0; j < v1; ++j) lf_tp_acc_push(&acc, lf_logit_xform(x[j], 1.0f, 30.0f), 1.0f, j == 3, 1);
    g[threadIdx.x] = lf_tp_share_make(acc, 1.0f, (float)(v1 - v0), V, 0.1f);
    __syncthreads();
    float lse;
    const lf_tp_merged mg = lf_tp_merge(g, 1, (int)blockDim.x, 0, 3, 1.0f, (const float *)NULL, V, 0.1f);
    const lf_tp_merged mw = lf_tp_merge_warp(g, 1, (int)blockDim.x, 0, 3, 1.0f, (const float *)NULL, V, 0.1f);
    lf_tp_slot_put(slots + threadIdx.x, g[threadIdx.x], 7u);
    lf_tp_share mine = {0.0f, 0.0f, 0.0f};
    while (!lf_tp_slot_get(slots + (threadIdx.x & 31), 7u, &mine)) {
    }
    const lf_tp_merged ml = lf_tp_merge_lanes(mine, blockDim.x < 32 ? (int)blockDim.x : 32, 3, 1.0f, (const float *)NULL, V, 0.1f);
    const float loss = lf_tp_loss(mg, 1e-4f, &lse) + lf_tp_loss(mw, 1e-4f, NULL) + lf_tp_loss(ml, 0.0f, NULL);
    out[threadIdx.x] = loss + lf_tp_grad_coef(mg, lse, 1e-4f) +
                       (float)lf_cp_global_token(cu, nseq, 2, 0, threadIdx.x) + (float)lf_cp_label(cu, nseq, 2, 0, ids, NULL, 0, -100);
}

template __global__ void fast_path<float, true>(float *, int64_t, float *);
template __global__ void fast_path<float, false>(float *, int64_t, float *);
template __global__ void fast_path<__nv_bfloat16, true>(__nv_bfloat16 *, int64_t, float *);
template __global__ void fast_path<__nv_bfloat16, false>(__nv_bfloat16 *, int64_t, float *);
template __global__ void fast_path<__half, true>(__half *, int64_t, float *);
template __global__ void fast_path<__half, false>(__half *, int64_t, float *);

template __global__ void everything<float, true, true>(float *, int64_t, float *, const float *, int);
template __global__ void everything<float, false, false>(float *, int64_t, float *, const float *, int);
template __global__ void everything<__nv_bfloat16, true, false>(__nv_bfloat16 *, int64_t, float *, const float *, int);
template __global__ void everything<__nv_bfloat16, false, true>(__nv_bfloat16 *, int64_t, float *, const float *, int);
template __global__ void everything<__half, true, true>(__half *, int64_t, float *, const float *, int);
template __global__ void everything<__half, false, false>(__half *, int64_t, float *, const float *, int);

int main(void)
{
    printf("compile_cuda: lossfuse_cuda.cuh compiled for every element type and option set\n");
    return 0;
}
