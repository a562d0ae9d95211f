/* sim_control.h: extra entry points of the simulated driver (not part of the
 * CUDA API). Tests and cuemm's driver layer reach them with dlsym on the loaded
 * driver, so their presence is also how cuemm tells the simulation apart.
 *
 * Functions are named as the driver API names them ("cuMemAlloc", without the
 * _v2 suffix of the exported symbol). */
#ifndef CUEMM_SIM_CONTROL_H
#define CUEMM_SIM_CONTROL_H

#ifdef __cplusplus
extern "C" {
#endif

/* Always 1: a library exporting this is the cuemm simulated driver. */
int cuemmSimIsSimulated(void);

/* How many times the named driver function was called since load or the last
 * reset; ~0ull when the name is not a function the simulation knows. */
unsigned long long cuemmSimCallCount(const char* function);
void cuemmSimResetCallCounts(void);

/* Make the nth call (1 = the next one) of the named function, and the
 * following times-1 calls, return `result` without doing anything.
 * Returns 0, or 1 when the name is unknown. The same faults can be given at
 * load time with CUEMM_SIM_FAULTS="cuMemAlloc:3:2[:times],..." where the
 * count runs from process start. */
int cuemmSimInjectFault(const char* function, unsigned long long nth, int result,
                        unsigned long long times);
void cuemmSimClearFaults(void);

/* Live allocations of a kind (0 device, 1 managed, 2 pinned host, 3 registered
 * host, 4 opened IPC mapping, 5 physical memory mapped by cuMemMap; -1 all kinds), and device bytes in use. */
unsigned long long cuemmSimLiveAllocations(int kind);
unsigned long long cuemmSimDeviceBytesInUse(int device);

/* What cuDeviceGetAttribute answers for a device's attribute from now on
 * (value < 0: the simulated H100's own answer again). Features read as absent
 * are refused as on such a device: virtual memory management (102) by
 * cuMemGetAllocationGranularity and cuMemCreate, memory pools (115) by
 * cuMemPoolCreate, with CUDA_ERROR_NOT_SUPPORTED. Returns 0, or 1 for an
 * unknown device or attribute. */
int cuemmSimSetDeviceAttribute(int device, int attribute, int value);

/* The address of the calling thread's count of driver calls under way (its
 * own for each thread), so that a test which makes the library's host
 * allocations fail can spare the driver's, without a call per allocation. */
int* cuemmSimDriverCallsUnderWay(void);

#ifdef __cplusplus
}
#endif
#endif
