/* Internal declarations shared by the stub_neuron PJRT plugin's C files.
 *
 * The library exports GetPjrtApi (and one debug counter); everything declared
 * here is hidden (-fvisibility=hidden). No function may abort the process:
 * every failure is returned as a PJRT_Error.
 */
#ifndef PJRT_STUB_NEURON_H_
#define PJRT_STUB_NEURON_H_

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pjrt_c_api.h" /* the official header, found by the build (see setup.py) */

#if PJRT_API_MAJOR != 0
#error "stub_neuron is written for PJRT C API major version 0"
#endif

#ifndef STUB_NEURON_VERSION /* set by setup.py from the package version */
#define STUB_NEURON_VERSION "0.0.0+unknown"
#endif

#define STUB_EXPORT __attribute__((visibility("default")))
#define STUB_PRINTF(fmt_index, first_arg) __attribute__((format(printf, fmt_index, first_arg)))

/* ------------------------------ identity --------------------------------- */

#define STUB_PLATFORM_NAME "neuron"
#define STUB_DEVICE_KIND "NeuronCore (stub)"
#define STUB_MEMORY_KIND "device"

/* ------------------------------ limits ----------------------------------- */

#define STUB_DEFAULT_NUM_DEVICES 4
#define STUB_MAX_LOCAL_DEVICES 1024
#define STUB_MAX_NODES 4096
#define STUB_MAX_GLOBAL_DEVICES 65536
#define STUB_DEFAULT_KV_TIMEOUT_MS 30000
#define STUB_MAX_DIMS 64
/* Key under which node <n> publishes its devices: "stub_neuron/devices/<n>". */
#define STUB_KV_KEY_PREFIX "stub_neuron/devices/"

/* Every object starts with a magic number, so a wrong or destroyed pointer of
 * our own kind is reported as INVALID_ARGUMENT instead of being trusted. */
enum {
  STUB_MAGIC_ERROR = 0x53455252,       /* "SERR" */
  STUB_MAGIC_EVENT = 0x53455654,       /* "SEVT" */
  STUB_MAGIC_CLIENT = 0x53434c54,      /* "SCLT" */
  STUB_MAGIC_DEVICE = 0x53444556,      /* "SDEV" */
  STUB_MAGIC_DESCRIPTION = 0x53445343, /* "SDSC" */
  STUB_MAGIC_MEMORY = 0x534d454d,      /* "SMEM" */
  STUB_MAGIC_BUFFER = 0x53425546,      /* "SBUF" */
  STUB_MAGIC_TOPOLOGY = 0x53544f50,    /* "STOP" */
  STUB_MAGIC_DEAD = 0x44454144,        /* "DEAD": written just before free */
};

/* -------------------------------- objects -------------------------------- */

struct PJRT_Error {
  uint32_t magic;
  bool is_static; /* the out-of-memory error is static and never freed */
  PJRT_Error_Code code;
  const char* message; /* NUL-terminated, points into the same allocation */
  size_t message_size;
};

struct PJRT_Event {
  uint32_t magic;
  PJRT_Error* error; /* owned; NULL when the event succeeded */
};

#define STUB_NUM_DEVICE_ATTRIBUTES 3

struct PJRT_DeviceDescription {
  uint32_t magic;
  int id;            /* global id, unique across all processes */
  int process_index; /* the node that owns the device */
  int local_index;   /* index among its node's devices */
  PJRT_NamedValue attributes[STUB_NUM_DEVICE_ATTRIBUTES];
  char debug_string[128];
  char to_string[64];
};

struct PJRT_Device {
  uint32_t magic;
  PJRT_DeviceDescription description;
  PJRT_Client* client;
  bool addressable;
  PJRT_Memory* memory; /* NULL for devices of other processes */
};

struct PJRT_Memory {
  uint32_t magic;
  int id;
  PJRT_Device* device;
  char debug_string[128];
  char to_string[64];
};

#define STUB_NUM_TOPOLOGY_ATTRIBUTES 2

/* The client's topology: every device of every node. Owned by the client
 * (XLA's C++ client asks for it in its constructor). */
struct PJRT_TopologyDescription {
  uint32_t magic;
  PJRT_Client* client;
  PJRT_DeviceDescription** descriptions; /* one per global device, in id order */
  PJRT_NamedValue attributes[STUB_NUM_TOPOLOGY_ATTRIBUTES];
  char serialized[128]; /* what PJRT_TopologyDescription_Serialize hands out */
};

struct PJRT_Client {
  uint32_t magic;
  atomic_long refs;      /* 1 for the caller until Client_Destroy, +1 per live buffer */
  atomic_bool destroyed; /* Client_Destroy was called */
  int node_id;
  int num_nodes;
  size_t num_devices; /* global */
  PJRT_Device* devices;
  PJRT_Device** device_ptrs;
  size_t num_addressable;
  PJRT_Device** addressable_ptrs;
  PJRT_Memory* memories; /* one per addressable device */
  PJRT_Memory** memory_ptrs;
  char platform_version[128];
  PJRT_TopologyDescription topology;
};

struct PJRT_Buffer {
  uint32_t magic;
  PJRT_Client* client; /* holds a reference */
  PJRT_Device* device;
  PJRT_Buffer_Type type;
  size_t num_dims;
  int64_t* dims; /* never NULL, even for scalars */
  int64_t* minor_to_major; /* the default layout: num_dims-1, ..., 0 (same allocation as dims) */
  size_t element_size;
  size_t num_bytes;
  pthread_mutex_t mu; /* guards data and deleted */
  void* data;         /* dense, row-major (major-to-minor) */
  bool deleted;
};

/* --------------------------------- errors -------------------------------- */

PJRT_Error* stub_error(PJRT_Error_Code code, const char* format, ...) STUB_PRINTF(2, 3);
/* Copies `error`'s code and message into a new error (for events). */
PJRT_Error* stub_error_copy(const PJRT_Error* error);
void stub_error_free(PJRT_Error* error);
bool stub_is_error(const PJRT_Error* error);
/* Checks an args pointer and its struct_size (at least `needed` bytes). */
PJRT_Error* stub_check_struct(const void* args, size_t struct_size, size_t needed, const char* name);

#define STUB_CHECK_ARGS_SIZE(args, sname, size)                                                 \
  do {                                                                                        \
    PJRT_Error* stub_check_error_ = stub_check_struct((args), (args) ? (args)->struct_size : 0, \
                                                      (size), #sname);                        \
    if (stub_check_error_ != NULL) return stub_check_error_;                                   \
  } while (0)
#define STUB_CHECK_ARGS(args, sname) STUB_CHECK_ARGS_SIZE(args, sname, sname##_STRUCT_SIZE)

/* The PJRT_CallbackError handed to the caller's KV callbacks. */
extern PJRT_CallbackError stub_callback_error;

/* --------------------------------- events -------------------------------- */

/* A completed event carrying `error` (owned; NULL for success). Returns NULL
 * only when out of memory, in which case `error` has been freed. */
PJRT_Event* stub_event_ready(PJRT_Error* error);

/* ------------------------------ bookkeeping ------------------------------ */

void* stub_alloc(size_t size); /* calloc that counts live objects */
void stub_free(void* p);
bool stub_is_initialized(void);

/* ----------------------------- object checks ----------------------------- */

/* Checks an object handed to `function` (every object starts with its magic):
 * NULL, or a magic other than `magic` (not ours, or destroyed), is an
 * INVALID_ARGUMENT error that names `what`. */
PJRT_Error* stub_check_object(const void* object, uint32_t magic, const char* what, const char* function);

/* STUB_CHECK_ARGS, then stub_check_object on args->field; `sname` is the
 * function's name without _Args. */
#define STUB_CHECK_ARGS_OBJECT(args, sname, field, magic, what)                                \
  STUB_CHECK_ARGS(args, sname##_Args);                                                       \
  do {                                                                                       \
    PJRT_Error* stub_object_error_ = stub_check_object((args)->field, (magic), (what), #sname); \
    if (stub_object_error_ != NULL) return stub_object_error_;                               \
  } while (0)

/* stub_check_object, and a client that was destroyed is FAILED_PRECONDITION. */
PJRT_Error* stub_check_client(const PJRT_Client* client, const char* function);
void stub_client_release(PJRT_Client* client);

/* ------------------------- PJRT_Api entry points ------------------------- */

PJRT_Error* StubClient_Create(PJRT_Client_Create_Args* args);
PJRT_Error* StubClient_Destroy(PJRT_Client_Destroy_Args* args);
PJRT_Error* StubClient_PlatformName(PJRT_Client_PlatformName_Args* args);
PJRT_Error* StubClient_ProcessIndex(PJRT_Client_ProcessIndex_Args* args);
PJRT_Error* StubClient_PlatformVersion(PJRT_Client_PlatformVersion_Args* args);
PJRT_Error* StubClient_Devices(PJRT_Client_Devices_Args* args);
PJRT_Error* StubClient_AddressableDevices(PJRT_Client_AddressableDevices_Args* args);
PJRT_Error* StubClient_LookupDevice(PJRT_Client_LookupDevice_Args* args);
PJRT_Error* StubClient_LookupAddressableDevice(PJRT_Client_LookupAddressableDevice_Args* args);
PJRT_Error* StubClient_AddressableMemories(PJRT_Client_AddressableMemories_Args* args);
PJRT_Error* StubClient_Compile(PJRT_Client_Compile_Args* args);
PJRT_Error* StubClient_TopologyDescription(PJRT_Client_TopologyDescription_Args* args);

/* Fills client->topology once the client's devices exist. */
PJRT_Error* stub_topology_init(PJRT_Client* client);
void stub_topology_free(PJRT_TopologyDescription* topology);
PJRT_Error* StubTopologyDescription_Destroy(PJRT_TopologyDescription_Destroy_Args* args);
PJRT_Error* StubTopologyDescription_PlatformName(PJRT_TopologyDescription_PlatformName_Args* args);
PJRT_Error* StubTopologyDescription_PlatformVersion(PJRT_TopologyDescription_PlatformVersion_Args* args);
PJRT_Error* StubTopologyDescription_GetDeviceDescriptions(PJRT_TopologyDescription_GetDeviceDescriptions_Args* args);
PJRT_Error* StubTopologyDescription_Serialize(PJRT_TopologyDescription_Serialize_Args* args);
PJRT_Error* StubTopologyDescription_Attributes(PJRT_TopologyDescription_Attributes_Args* args);

PJRT_Error* StubDeviceDescription_Id(PJRT_DeviceDescription_Id_Args* args);
PJRT_Error* StubDeviceDescription_ProcessIndex(PJRT_DeviceDescription_ProcessIndex_Args* args);
PJRT_Error* StubDeviceDescription_Attributes(PJRT_DeviceDescription_Attributes_Args* args);
PJRT_Error* StubDeviceDescription_Kind(PJRT_DeviceDescription_Kind_Args* args);
PJRT_Error* StubDeviceDescription_DebugString(PJRT_DeviceDescription_DebugString_Args* args);
PJRT_Error* StubDeviceDescription_ToString(PJRT_DeviceDescription_ToString_Args* args);

PJRT_Error* StubDevice_GetDescription(PJRT_Device_GetDescription_Args* args);
PJRT_Error* StubDevice_IsAddressable(PJRT_Device_IsAddressable_Args* args);
PJRT_Error* StubDevice_LocalHardwareId(PJRT_Device_LocalHardwareId_Args* args);
PJRT_Error* StubDevice_AddressableMemories(PJRT_Device_AddressableMemories_Args* args);
PJRT_Error* StubDevice_DefaultMemory(PJRT_Device_DefaultMemory_Args* args);

PJRT_Error* StubMemory_Id(PJRT_Memory_Id_Args* args);
PJRT_Error* StubMemory_Kind(PJRT_Memory_Kind_Args* args);
PJRT_Error* StubMemory_DebugString(PJRT_Memory_DebugString_Args* args);
PJRT_Error* StubMemory_ToString(PJRT_Memory_ToString_Args* args);
PJRT_Error* StubMemory_AddressableByDevices(PJRT_Memory_AddressableByDevices_Args* args);

PJRT_Error* StubClient_BufferFromHostBuffer(PJRT_Client_BufferFromHostBuffer_Args* args);
PJRT_Error* StubBuffer_Destroy(PJRT_Buffer_Destroy_Args* args);
PJRT_Error* StubBuffer_ElementType(PJRT_Buffer_ElementType_Args* args);
PJRT_Error* StubBuffer_Dimensions(PJRT_Buffer_Dimensions_Args* args);
PJRT_Error* StubBuffer_OnDeviceSizeInBytes(PJRT_Buffer_OnDeviceSizeInBytes_Args* args);
PJRT_Error* StubBuffer_Device(PJRT_Buffer_Device_Args* args);
PJRT_Error* StubBuffer_Memory(PJRT_Buffer_Memory_Args* args);
PJRT_Error* StubBuffer_Delete(PJRT_Buffer_Delete_Args* args);
PJRT_Error* StubBuffer_IsDeleted(PJRT_Buffer_IsDeleted_Args* args);
PJRT_Error* StubBuffer_ToHostBuffer(PJRT_Buffer_ToHostBuffer_Args* args);
PJRT_Error* StubBuffer_ReadyEvent(PJRT_Buffer_ReadyEvent_Args* args);
PJRT_Error* StubBuffer_UnpaddedDimensions(PJRT_Buffer_UnpaddedDimensions_Args* args);
PJRT_Error* StubBuffer_DynamicDimensionIndices(PJRT_Buffer_DynamicDimensionIndices_Args* args);
PJRT_Error* StubBuffer_GetMemoryLayout(PJRT_Buffer_GetMemoryLayout_Args* args);
PJRT_Error* StubBuffer_IsOnCpu(PJRT_Buffer_IsOnCpu_Args* args);

#endif /* PJRT_STUB_NEURON_H_ */
