// mtl_emu_prelude.h: what a generated kernel unit (mtl_emu_kernels.cc.in) includes before the kernel's source,
// while names such as `device` and `double` still mean what C and C++ say: the C headers a kernel file
// may include (gpu_plan.h, gpu_push.h: their include guards then skip them inside the kernel) and the
// emulator's entry types.
#ifndef GOKV_MTL_EMU_PRELUDE_H
#define GOKV_MTL_EMU_PRELUDE_H

#include "gpu_plan.h"
#include "gpu_push.h"
#include "mtl_emu_kernel.h"

#include <metal_stdlib>

#endif
