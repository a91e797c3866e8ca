// popkit HIP-on-CUDA: <hip/hip_runtime.h> maps to CUDA (see ../popkit_hip_on_cuda.h).
#pragma once
#include "../popkit_hip_on_cuda.h"
