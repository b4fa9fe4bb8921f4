/* runtime/device.c - the table of devices (runtime/device.h) and its CPU
 * instance: host memory, nothing to set up around a kernel. */
#include "runtime/device.h"

const device_ops device_cpu = {
    .dl_type = kDLCPU,
    .host_memory = 1,
    .max_id = 0,
};

/* In opjit_device's order (OPJIT_DEVICE_LIST): each device's instance. */
const device_ops *const devices[OPJIT_DEVICE_COUNT] = {
    [OPJIT_CPU] = &device_cpu,
    [OPJIT_CUDA] = &device_cuda,
};

int device_of_dl(int dl_type)
{
    for (int d = 0; d < OPJIT_DEVICE_COUNT; d++)
        if (devices[d] && devices[d]->dl_type == dl_type)
            return d;
    return -1;
}
