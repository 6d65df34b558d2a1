/* The PJRT_Api table, errors, events and plugin setup of the stub_neuron plugin.
 *
 * GetPjrtApi is the library's only PJRT export. Every slot that XLA's C++
 * client (PjRtCApiClient, used by JAX and torch_xla) calls without a NULL
 * check while creating a client, listing devices and moving buffers is
 * filled; slots for features the stub lacks stay NULL, so a loader must gate
 * every call on them.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stub_neuron.h"

/* ------------------------------ bookkeeping ------------------------------ */

static atomic_long live_objects; /* clients + buffers + events + errors */
static atomic_bool initialized;

void* stub_alloc(size_t size) {
  void* p = calloc(1, size);
  if (p != NULL) atomic_fetch_add(&live_objects, 1);
  return p;
}

void stub_free(void* p) {
  if (p == NULL) return;
  atomic_fetch_sub(&live_objects, 1);
  free(p);
}

bool stub_is_initialized(void) { return atomic_load(&initialized); }

/* Not part of PJRT: how many heap objects the plugin holds right now. The
 * tests use it to prove that destroying what was created frees everything. */
STUB_EXPORT int64_t StubNeuron_LiveObjectCount(void) { return (int64_t)atomic_load(&live_objects); }

/* --------------------------------- errors -------------------------------- */

static PJRT_Error out_of_memory_error = {
    .magic = STUB_MAGIC_ERROR,
    .is_static = true,
    .code = PJRT_Error_Code_RESOURCE_EXHAUSTED,
    .message = "stub_neuron: out of host memory",
    .message_size = sizeof("stub_neuron: out of host memory") - 1,
};

static PJRT_Error* error_from_text(PJRT_Error_Code code, const char* text, size_t size) {
  PJRT_Error* error = stub_alloc(sizeof(PJRT_Error) + size + 1);
  if (error == NULL) return &out_of_memory_error;
  char* message = (char*)(error + 1);
  if (size > 0) memcpy(message, text, size);
  message[size] = '\0';
  error->magic = STUB_MAGIC_ERROR;
  error->code = code;
  error->message = message;
  error->message_size = size;
  return error;
}

PJRT_Error* stub_error(PJRT_Error_Code code, const char* format, ...) {
  char text[1024];
  va_list ap;
  va_start(ap, format);
  int n = vsnprintf(text, sizeof(text), format, ap);
  va_end(ap);
  if (n < 0) n = 0;
  if ((size_t)n >= sizeof(text)) n = sizeof(text) - 1; /* truncated, still useful */
  return error_from_text(code, text, (size_t)n);
}

bool stub_is_error(const PJRT_Error* error) { return error != NULL && error->magic == STUB_MAGIC_ERROR; }

PJRT_Error* stub_error_copy(const PJRT_Error* error) {
  if (!stub_is_error(error)) return NULL;
  return error_from_text(error->code, error->message, error->message_size);
}

void stub_error_free(PJRT_Error* error) {
  if (!stub_is_error(error) || error->is_static) return;
  error->magic = STUB_MAGIC_DEAD;
  stub_free(error);
}

PJRT_Error* stub_check_struct(const void* args, size_t struct_size, size_t needed, const char* name) {
  if (args == NULL) return stub_error(PJRT_Error_Code_INVALID_ARGUMENT, "%s is NULL", name);
  if (struct_size < needed) {
    return stub_error(PJRT_Error_Code_INVALID_ARGUMENT,
                      "Unexpected %s size: expected at least %zu, got %zu (the caller was built "
                      "against an older PJRT C API header)",
                      name, needed, struct_size);
  }
  return NULL;
}

PJRT_Error* stub_check_object(const void* object, uint32_t magic, const char* what, const char* function) {
  if (object == NULL) return stub_error(PJRT_Error_Code_INVALID_ARGUMENT, "%s: %s is NULL", function, what);
  if (*(const uint32_t*)object != magic) {
    return stub_error(PJRT_Error_Code_INVALID_ARGUMENT, "%s: not a stub_neuron %s (a wrong or destroyed pointer)",
                      function, what);
  }
  return NULL;
}

static PJRT_Error* callback_error_impl(PJRT_Error_Code code, const char* message, size_t message_size) {
  if (message == NULL) message_size = 0;
  return error_from_text(code, message ? message : "", message_size);
}

/* The KV callback args take a pointer to this function pointer. */
PJRT_CallbackError stub_callback_error = callback_error_impl;

static void StubError_Destroy(PJRT_Error_Destroy_Args* args) {
  if (args == NULL || args->struct_size < PJRT_Error_Destroy_Args_STRUCT_SIZE) return;
  stub_error_free(args->error);
}

static void StubError_Message(PJRT_Error_Message_Args* args) {
  if (args == NULL || args->struct_size < PJRT_Error_Message_Args_STRUCT_SIZE) return;
  if (!stub_is_error(args->error)) {
    args->message = "";
    args->message_size = 0;
    return;
  }
  args->message = args->error->message;
  args->message_size = args->error->message_size;
}

static PJRT_Error* StubError_GetCode(PJRT_Error_GetCode_Args* args) {
  STUB_CHECK_ARGS(args, PJRT_Error_GetCode_Args);
  if (!stub_is_error(args->error)) {
    return stub_error(PJRT_Error_Code_INVALID_ARGUMENT,
                      "PJRT_Error_GetCode: the error is NULL or was not created by stub_neuron");
  }
  args->code = args->error->code;
  return NULL;
}

/* --------------------------------- events -------------------------------- */

/* Everything the stub does is synchronous, so every event is born ready. */
PJRT_Event* stub_event_ready(PJRT_Error* error) {
  PJRT_Event* event = stub_alloc(sizeof(PJRT_Event));
  if (event == NULL) {
    stub_error_free(error);
    return NULL;
  }
  event->magic = STUB_MAGIC_EVENT;
  event->error = error;
  return event;
}

#define STUB_CHECK_EVENT(args, sname) STUB_CHECK_ARGS_OBJECT(args, sname, event, STUB_MAGIC_EVENT, "event")

static PJRT_Error* StubEvent_Destroy(PJRT_Event_Destroy_Args* args) {
  STUB_CHECK_ARGS(args, PJRT_Event_Destroy_Args);
  if (args->event == NULL) return NULL;
  PJRT_Error* error = stub_check_object(args->event, STUB_MAGIC_EVENT, "event", "PJRT_Event_Destroy");
  if (error != NULL) return error;
  stub_error_free(args->event->error);
  args->event->magic = STUB_MAGIC_DEAD;
  stub_free(args->event);
  return NULL;
}

static PJRT_Error* StubEvent_IsReady(PJRT_Event_IsReady_Args* args) {
  STUB_CHECK_EVENT(args, PJRT_Event_IsReady);
  args->is_ready = true;
  return NULL;
}

static PJRT_Error* StubEvent_Error(PJRT_Event_Error_Args* args) {
  STUB_CHECK_EVENT(args, PJRT_Event_Error);
  return stub_error_copy(args->event->error); /* each call returns its own copy */
}

static PJRT_Error* StubEvent_Await(PJRT_Event_Await_Args* args) {
  STUB_CHECK_EVENT(args, PJRT_Event_Await);
  return stub_error_copy(args->event->error);
}

static PJRT_Error* StubEvent_OnReady(PJRT_Event_OnReady_Args* args) {
  STUB_CHECK_EVENT(args, PJRT_Event_OnReady);
  if (args->callback == NULL) {
    return stub_error(PJRT_Error_Code_INVALID_ARGUMENT, "PJRT_Event_OnReady: callback is NULL");
  }
  /* Already ready: run the callback now, on the caller's thread. It owns the error. */
  args->callback(stub_error_copy(args->event->error), args->user_arg);
  return NULL;
}

/* --------------------------------- plugin -------------------------------- */

#define STUB_STRING_ATTRIBUTE(key, text)                                                  \
  {                                                                                       \
    .struct_size = PJRT_NamedValue_STRUCT_SIZE, .name = key, .name_size = sizeof(key) - 1, \
    .type = PJRT_NamedValue_kString, .string_value = text, .value_size = sizeof(text) - 1, \
  }
#define STUB_INT_ATTRIBUTE(key, number)                                                   \
  {                                                                                       \
    .struct_size = PJRT_NamedValue_STRUCT_SIZE, .name = key, .name_size = sizeof(key) - 1, \
    .type = PJRT_NamedValue_kInt64, .int64_value = number, .value_size = 1,               \
  }
#define STUB_BOOL_ATTRIBUTE(key, flag)                                                    \
  {                                                                                       \
    .struct_size = PJRT_NamedValue_STRUCT_SIZE, .name = key, .name_size = sizeof(key) - 1, \
    .type = PJRT_NamedValue_kBool, .bool_value = flag, .value_size = 1,                   \
  }

static const PJRT_NamedValue plugin_attributes[] = {
    STUB_STRING_ATTRIBUTE("stub_neuron_version", STUB_NEURON_VERSION),
    STUB_INT_ATTRIBUTE("pjrt_c_api_major_version", PJRT_API_MAJOR),
    STUB_INT_ATTRIBUTE("pjrt_c_api_minor_version", PJRT_API_MINOR),
    STUB_BOOL_ATTRIBUTE("supports_compile", false),
};

static PJRT_Error* StubPlugin_Initialize(PJRT_Plugin_Initialize_Args* args) {
  STUB_CHECK_ARGS(args, PJRT_Plugin_Initialize_Args);
  /* A real plugin opens its driver here. Calling it twice is harmless. */
  atomic_store(&initialized, true);
  return NULL;
}

static PJRT_Error* StubPlugin_Attributes(PJRT_Plugin_Attributes_Args* args) {
  STUB_CHECK_ARGS(args, PJRT_Plugin_Attributes_Args);
  args->attributes = plugin_attributes;
  args->num_attributes = sizeof(plugin_attributes) / sizeof(plugin_attributes[0]);
  return NULL;
}

/* ------------------------- functions it does not have ------------------------- */

/* XLA's C++ client calls some slots without a NULL check when a framework asks for
 * something the stub cannot do (jax.jit asks for memory statistics, moving an array
 * to another device copies to that device's memory). A NULL slot there is a
 * segfault; these answer UNIMPLEMENTED, which the framework reports as an error. */
#define STUB_UNIMPLEMENTED(name, what)                                                        \
  static PJRT_Error* StubUnimplemented_##name(name##_Args* args) {                           \
    (void)args;                                                                              \
    return stub_error(PJRT_Error_Code_UNIMPLEMENTED, #name ": the stub_neuron plugin has no " what); \
  }

STUB_UNIMPLEMENTED(PJRT_Device_MemoryStats, "memory statistics")
STUB_UNIMPLEMENTED(PJRT_Buffer_CopyToMemory, "copies between memories (it keeps data in host memory)")
STUB_UNIMPLEMENTED(PJRT_Buffer_CopyToDevice, "copies between devices (it keeps data in host memory)")

/* ------------------------------- the table ------------------------------- */

static const PJRT_Api stub_api = {
    .struct_size = PJRT_Api_STRUCT_SIZE,
    .extension_start = NULL,
    .pjrt_api_version =
        {
            .struct_size = PJRT_Api_Version_STRUCT_SIZE,
            .extension_start = NULL,
            .major_version = PJRT_API_MAJOR,
            .minor_version = PJRT_API_MINOR,
        },

    .PJRT_Error_Destroy = StubError_Destroy,
    .PJRT_Error_Message = StubError_Message,
    .PJRT_Error_GetCode = StubError_GetCode,

    .PJRT_Plugin_Initialize = StubPlugin_Initialize,
    .PJRT_Plugin_Attributes = StubPlugin_Attributes,

    .PJRT_Event_Destroy = StubEvent_Destroy,
    .PJRT_Event_IsReady = StubEvent_IsReady,
    .PJRT_Event_Error = StubEvent_Error,
    .PJRT_Event_Await = StubEvent_Await,
    .PJRT_Event_OnReady = StubEvent_OnReady,

    .PJRT_Client_Create = StubClient_Create,
    .PJRT_Client_Destroy = StubClient_Destroy,
    .PJRT_Client_PlatformName = StubClient_PlatformName,
    .PJRT_Client_ProcessIndex = StubClient_ProcessIndex,
    .PJRT_Client_PlatformVersion = StubClient_PlatformVersion,
    .PJRT_Client_Devices = StubClient_Devices,
    .PJRT_Client_AddressableDevices = StubClient_AddressableDevices,
    .PJRT_Client_LookupDevice = StubClient_LookupDevice,
    .PJRT_Client_LookupAddressableDevice = StubClient_LookupAddressableDevice,
    .PJRT_Client_AddressableMemories = StubClient_AddressableMemories,
    .PJRT_Client_Compile = StubClient_Compile,
    .PJRT_Client_BufferFromHostBuffer = StubClient_BufferFromHostBuffer,
    .PJRT_Client_TopologyDescription = StubClient_TopologyDescription,

    .PJRT_TopologyDescription_Destroy = StubTopologyDescription_Destroy,
    .PJRT_TopologyDescription_PlatformName = StubTopologyDescription_PlatformName,
    .PJRT_TopologyDescription_PlatformVersion = StubTopologyDescription_PlatformVersion,
    .PJRT_TopologyDescription_GetDeviceDescriptions = StubTopologyDescription_GetDeviceDescriptions,
    .PJRT_TopologyDescription_Serialize = StubTopologyDescription_Serialize,
    .PJRT_TopologyDescription_Attributes = StubTopologyDescription_Attributes,

    .PJRT_DeviceDescription_Id = StubDeviceDescription_Id,
    .PJRT_DeviceDescription_ProcessIndex = StubDeviceDescription_ProcessIndex,
    .PJRT_DeviceDescription_Attributes = StubDeviceDescription_Attributes,
    .PJRT_DeviceDescription_Kind = StubDeviceDescription_Kind,
    .PJRT_DeviceDescription_DebugString = StubDeviceDescription_DebugString,
    .PJRT_DeviceDescription_ToString = StubDeviceDescription_ToString,

    .PJRT_Device_GetDescription = StubDevice_GetDescription,
    .PJRT_Device_IsAddressable = StubDevice_IsAddressable,
    .PJRT_Device_LocalHardwareId = StubDevice_LocalHardwareId,
    .PJRT_Device_AddressableMemories = StubDevice_AddressableMemories,
    .PJRT_Device_DefaultMemory = StubDevice_DefaultMemory,
    .PJRT_Device_MemoryStats = StubUnimplemented_PJRT_Device_MemoryStats,

    .PJRT_Memory_Id = StubMemory_Id,
    .PJRT_Memory_Kind = StubMemory_Kind,
    .PJRT_Memory_DebugString = StubMemory_DebugString,
    .PJRT_Memory_ToString = StubMemory_ToString,
    .PJRT_Memory_AddressableByDevices = StubMemory_AddressableByDevices,

    .PJRT_Buffer_Destroy = StubBuffer_Destroy,
    .PJRT_Buffer_ElementType = StubBuffer_ElementType,
    .PJRT_Buffer_Dimensions = StubBuffer_Dimensions,
    .PJRT_Buffer_OnDeviceSizeInBytes = StubBuffer_OnDeviceSizeInBytes,
    .PJRT_Buffer_Device = StubBuffer_Device,
    .PJRT_Buffer_Memory = StubBuffer_Memory,
    .PJRT_Buffer_Delete = StubBuffer_Delete,
    .PJRT_Buffer_IsDeleted = StubBuffer_IsDeleted,
    .PJRT_Buffer_ToHostBuffer = StubBuffer_ToHostBuffer,
    .PJRT_Buffer_ReadyEvent = StubBuffer_ReadyEvent,
    .PJRT_Buffer_UnpaddedDimensions = StubBuffer_UnpaddedDimensions,
    .PJRT_Buffer_DynamicDimensionIndices = StubBuffer_DynamicDimensionIndices,
    .PJRT_Buffer_GetMemoryLayout = StubBuffer_GetMemoryLayout,
    .PJRT_Buffer_IsOnCpu = StubBuffer_IsOnCpu,
    .PJRT_Buffer_CopyToDevice = StubUnimplemented_PJRT_Buffer_CopyToDevice,
    .PJRT_Buffer_CopyToMemory = StubUnimplemented_PJRT_Buffer_CopyToMemory,
    /* Everything else (executables, copies between devices, async transfers,
     * ...) is deliberately NULL: XLA's C++ client only calls those slots for
     * features the stub does not have (compile, execute, copies). */
};

STUB_EXPORT const PJRT_Api* GetPjrtApi(void) { return &stub_api; }
