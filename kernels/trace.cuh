// trace.cuh: a timeline of one decode step, for `qwen38gen bench --trace` only. The trace variant
// of a program defines Q38_TRACE and wraps every entry point's body in a TraceScope; the programs
// that run for results and pass the gate never include this header.
//
// Every block of every launch appends one TraceRec: the launch's grid id (%gridid, one per
// launch), the kernel's index in the program's entry list, the SM, and three %globaltimer
// readings in ns: when its thread 0 entered the entry point, when thread 0 came out of
// griddepcontrol.wait (pdl_wait in common.cuh; 0 if it never waited), and when the block's last
// thread was done with the body (after a barrier). The host (qwen38gen/perf/trace.py) groups the
// records into launches by grid id and matches them to the schedule.
//
// Control block (host-written before the replay, through cuModuleGetGlobal):
//   q38_trace_ctl.buf  TraceRec[cap] in device memory;  .cap;  .n = 0 before the replay, the
//   number of blocks that ran after it (records past cap are counted, not stored).
//
// Compiles alone:
//   nvcc -arch=sm_90 -std=c++17 -cubin -DQ38_TRACE -x cu kernels/trace.cuh -o /dev/null
#pragma once
#include "common.cuh"

namespace q38 {

struct TraceRec {
  unsigned long long grid;        // %gridid
  unsigned long long t0, tw, t1;  // %globaltimer, ns: entered, out of the wait (0: none), done
  unsigned int kid, smid;         // entry index in the program, %smid
};
static_assert(sizeof(TraceRec) == 40, "TraceRec: the host reads 40-byte records");

struct TraceCtl {
  TraceRec* buf;
  unsigned int cap, n;
};

}  // namespace q38

extern "C" {
__device__ q38::TraceCtl q38_trace_ctl;
}

namespace q38 {

__device__ __forceinline__ bool trace_thread0() {
  return threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0;
}

// Lives for the whole body of an entry point: constructed first, destroyed after the body.
struct TraceScope {
  unsigned long long t0;
  unsigned int kid;
  __device__ __forceinline__ explicit TraceScope(unsigned int k) : kid(k) {
    t0 = globaltimer_ns();
    if (trace_thread0()) trace_wait_ns() = 0;
  }
  __device__ __forceinline__ ~TraceScope() {
    __syncthreads();
    if (trace_thread0()) {
      TraceRec r;
      r.t1 = globaltimer_ns();
      r.t0 = t0;
      r.tw = trace_wait_ns();
      r.kid = kid;
      asm volatile("mov.u64 %0, %%gridid;" : "=l"(r.grid));
      asm volatile("mov.u32 %0, %%smid;" : "=r"(r.smid));
      const unsigned int i = atomicAdd(&q38_trace_ctl.n, 1u);
      if (i < q38_trace_ctl.cap) q38_trace_ctl.buf[i] = r;
    }
  }
};

}  // namespace q38
