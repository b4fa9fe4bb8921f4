/* tests/test_device.c - the device interface (runtime/device.h): every
 * device of OPJIT_DEVICE_LIST has an instance that agrees with the list,
 * DLPack types map back to their device, and the CPU instance is host
 * memory with nothing to do around a kernel. runtime/call.c's use of it
 * without naming a device is checked by tests/test_layers.sh. */
#include <string.h>

#include "runtime/device.h"
#include "t.h"

static void test_every_device_has_an_instance(void)
{
#define X(name, str, dl)                                                        \
    CHECKF(devices[OPJIT_##name] && devices[OPJIT_##name]->dl_type == dl,       \
           "device %s", str);                                                   \
    CHECK(device_of_dl(dl) == OPJIT_##name);
    OPJIT_DEVICE_LIST(X)
#undef X
    CHECK(device_of_dl(kDLVulkan) == -1);
}

static void test_instances(void)
{
    CHECK(devices[OPJIT_CPU]->host_memory && devices[OPJIT_CPU]->max_id == 0);
    CHECK(!devices[OPJIT_CPU]->call_begin && !devices[OPJIT_CPU]->mem_alloc);
    const device_ops *c = devices[OPJIT_CUDA];
    CHECK(!c->host_memory && c->call_begin && c->call_end && c->enter && c->leave &&
          c->mem_alloc && c->copy);
}

int main(void)
{
    T_RUN(test_every_device_has_an_instance);
    T_RUN(test_instances);
    return t_done();
}
