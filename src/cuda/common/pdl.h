// Programmatic dependent launch (PDL, sm_90+): a kernel launched with it may start while the kernel before
// it in the stream is still running, and waits (griddepcontrol.wait) before it reads that kernel's output.
// The decode ops launch this way, so a step's chain of small kernels and GEMVs loses the launch gap between
// kernels and each GEMV streams its first weights before its input is ready. Contract for every kernel
// launched through launch_pdl (pdl.cuh): every block executes pdl::wait() before it reads or writes any
// buffer another kernel of the step touches, and before it exits (a grid whose blocks all left early would
// count as complete while its predecessor still runs). Off on sm_80-89 (the attribute is not set).
#pragma once

namespace mxq::cuda {

// Process-wide switch (default on), to measure both from one build (`mxq-bench decode --no-pdl`) and to
// test that both give identical bytes.
void set_pdl(bool on);
// True when PDL is on and the current device is sm_90 or newer.
bool pdl_active();

}  // namespace mxq::cuda
