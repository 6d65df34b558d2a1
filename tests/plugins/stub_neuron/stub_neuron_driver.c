/* A C test driver for the stub_neuron PJRT library, compiled by the tests.
 *
 * Built two ways by test_stub_neuron_c.py: linked with the plugin's sources
 * under AddressSanitizer/UBSan/LeakSanitizer (proves no crash, no UB, no leak),
 * and against the installed libpjrt_stub_neuron.so through dlopen (proves the
 * shipped artifact). Prints one line per check and exits non-zero on failure.
 */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pjrt_c_api.h"

static const PJRT_Api* api;
static int64_t (*live_objects)(void);
static int failures;

#define CHECK(cond, ...)                                         \
  do {                                                          \
    if (!(cond)) {                                              \
      ++failures;                                               \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);      \
      fprintf(stderr, __VA_ARGS__);                             \
      fprintf(stderr, "\n");                                    \
    }                                                           \
  } while (0)

/* ------------------------------- error helpers ---------------------------- */

static PJRT_Error_Code code_of(PJRT_Error* error) {
  PJRT_Error_GetCode_Args args = {.struct_size = PJRT_Error_GetCode_Args_STRUCT_SIZE, .error = error};
  PJRT_Error* e = api->PJRT_Error_GetCode(&args);
  if (e != NULL) return (PJRT_Error_Code)-1;
  return args.code;
}

static const char* message_of(PJRT_Error* error, char* buf, size_t n) {
  PJRT_Error_Message_Args args = {.struct_size = PJRT_Error_Message_Args_STRUCT_SIZE, .error = error};
  api->PJRT_Error_Message(&args);
  snprintf(buf, n, "%.*s", (int)args.message_size, args.message);
  return buf;
}

static void destroy_error(PJRT_Error* error) {
  PJRT_Error_Destroy_Args args = {.struct_size = PJRT_Error_Destroy_Args_STRUCT_SIZE, .error = error};
  api->PJRT_Error_Destroy(&args);
}

/* Consumes `error`; true when it is NULL. */
static bool ok(PJRT_Error* error, const char* what) {
  if (error == NULL) return true;
  char buf[1024];
  ++failures;
  fprintf(stderr, "FAIL %s: unexpected error %d: %s\n", what, code_of(error), message_of(error, buf, sizeof buf));
  destroy_error(error);
  return false;
}

/* Consumes `error`; checks its code and that its message contains `needle`. */
static void expect_error(PJRT_Error* error, PJRT_Error_Code code, const char* needle, const char* what) {
  if (error == NULL) {
    ++failures;
    fprintf(stderr, "FAIL %s: expected error code %d, got success\n", what, code);
    return;
  }
  char buf[1024];
  PJRT_Error_Code got = code_of(error);
  message_of(error, buf, sizeof buf);
  if (got != code || (needle != NULL && strstr(buf, needle) == NULL)) {
    ++failures;
    fprintf(stderr, "FAIL %s: expected code %d containing '%s', got %d: %s\n", what, code, needle ? needle : "", got,
            buf);
  } else {
    printf("ok   %s -> %d: %s\n", what, got, buf);
  }
  destroy_error(error);
}

/* --------------------------------- helpers -------------------------------- */

static PJRT_NamedValue int_option(const char* name, int64_t value) {
  return (PJRT_NamedValue){.struct_size = PJRT_NamedValue_STRUCT_SIZE,
                           .name = name,
                           .name_size = strlen(name),
                           .type = PJRT_NamedValue_kInt64,
                           .int64_value = value,
                           .value_size = 1};
}

static PJRT_Error* create_client(const PJRT_NamedValue* options, size_t n, PJRT_Client** client) {
  PJRT_Client_Create_Args args = {.struct_size = PJRT_Client_Create_Args_STRUCT_SIZE,
                                  .create_options = options,
                                  .num_options = n};
  PJRT_Error* e = api->PJRT_Client_Create(&args);
  *client = args.client;
  return e;
}

static void destroy_client(PJRT_Client* client) {
  PJRT_Client_Destroy_Args args = {.struct_size = PJRT_Client_Destroy_Args_STRUCT_SIZE, .client = client};
  ok(api->PJRT_Client_Destroy(&args), "PJRT_Client_Destroy");
}

static void destroy_event(PJRT_Event* event) {
  PJRT_Event_Destroy_Args args = {.struct_size = PJRT_Event_Destroy_Args_STRUCT_SIZE, .event = event};
  ok(api->PJRT_Event_Destroy(&args), "PJRT_Event_Destroy");
}

static void destroy_buffer(PJRT_Buffer* buffer) {
  PJRT_Buffer_Destroy_Args args = {.struct_size = PJRT_Buffer_Destroy_Args_STRUCT_SIZE, .buffer = buffer};
  ok(api->PJRT_Buffer_Destroy(&args), "PJRT_Buffer_Destroy");
}

static PJRT_Device* const* addressable_devices(PJRT_Client* client, size_t* n) {
  PJRT_Client_AddressableDevices_Args args = {.struct_size = PJRT_Client_AddressableDevices_Args_STRUCT_SIZE,
                                              .client = client};
  ok(api->PJRT_Client_AddressableDevices(&args), "PJRT_Client_AddressableDevices");
  *n = args.num_addressable_devices;
  return args.addressable_devices;
}

static PJRT_Device* const* all_devices(PJRT_Client* client, size_t* n) {
  PJRT_Client_Devices_Args args = {.struct_size = PJRT_Client_Devices_Args_STRUCT_SIZE, .client = client};
  ok(api->PJRT_Client_Devices(&args), "PJRT_Client_Devices");
  *n = args.num_devices;
  return args.devices;
}

static PJRT_DeviceDescription* description_of(PJRT_Device* device) {
  PJRT_Device_GetDescription_Args args = {.struct_size = PJRT_Device_GetDescription_Args_STRUCT_SIZE,
                                          .device = device};
  ok(api->PJRT_Device_GetDescription(&args), "PJRT_Device_GetDescription");
  return args.device_description;
}

static int device_id(PJRT_Device* device) {
  PJRT_DeviceDescription_Id_Args args = {.struct_size = PJRT_DeviceDescription_Id_Args_STRUCT_SIZE,
                                         .device_description = description_of(device)};
  ok(api->PJRT_DeviceDescription_Id(&args), "PJRT_DeviceDescription_Id");
  return args.id;
}

static int device_process(PJRT_Device* device) {
  PJRT_DeviceDescription_ProcessIndex_Args args = {
      .struct_size = PJRT_DeviceDescription_ProcessIndex_Args_STRUCT_SIZE,
      .device_description = description_of(device)};
  ok(api->PJRT_DeviceDescription_ProcessIndex(&args), "PJRT_DeviceDescription_ProcessIndex");
  return args.process_index;
}

static PJRT_Error* upload(PJRT_Client* client, PJRT_Device* device, const void* data, PJRT_Buffer_Type type,
                          const int64_t* dims, size_t nd, const int64_t* strides, size_t ns, PJRT_Buffer** out) {
  PJRT_Client_BufferFromHostBuffer_Args args = {
      .struct_size = PJRT_Client_BufferFromHostBuffer_Args_STRUCT_SIZE,
      .client = client,
      .data = data,
      .type = type,
      .dims = dims,
      .num_dims = nd,
      .byte_strides = strides,
      .num_byte_strides = ns,
      .host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableOnlyDuringCall,
      .device = device,
  };
  PJRT_Error* e = api->PJRT_Client_BufferFromHostBuffer(&args);
  *out = args.buffer;
  if (e == NULL) {
    PJRT_Event_IsReady_Args ready = {.struct_size = PJRT_Event_IsReady_Args_STRUCT_SIZE,
                                     .event = args.done_with_host_buffer};
    ok(api->PJRT_Event_IsReady(&ready), "PJRT_Event_IsReady");
    CHECK(ready.is_ready, "done_with_host_buffer is ready");
    destroy_event(args.done_with_host_buffer);
  }
  return e;
}

static PJRT_Error* download(PJRT_Buffer* buffer, void* dst, size_t dst_size) {
  PJRT_Buffer_ToHostBuffer_Args args = {.struct_size = PJRT_Buffer_ToHostBuffer_Args_STRUCT_SIZE,
                                        .src = buffer,
                                        .dst = dst,
                                        .dst_size = dst_size};
  PJRT_Error* e = api->PJRT_Buffer_ToHostBuffer(&args);
  if (e == NULL) {
    PJRT_Event_Await_Args await = {.struct_size = PJRT_Event_Await_Args_STRUCT_SIZE, .event = args.event};
    ok(api->PJRT_Event_Await(&await), "PJRT_Event_Await");
    destroy_event(args.event);
  }
  return e;
}

/* -------------------------------- the checks ------------------------------ */

static void check_api_table(void) {
  CHECK(api->struct_size >= PJRT_Api_STRUCT_SIZE, "api struct_size %zu", api->struct_size);
  CHECK(api->pjrt_api_version.major_version == PJRT_API_MAJOR, "major %d", api->pjrt_api_version.major_version);
  CHECK(api->pjrt_api_version.minor_version == PJRT_API_MINOR, "minor %d", api->pjrt_api_version.minor_version);
  /* Deliberately missing slots stay NULL so loaders must gate on them. */
  CHECK(api->PJRT_Client_DefaultDeviceAssignment == NULL, "DefaultDeviceAssignment is NULL");
  CHECK(api->PJRT_LoadedExecutable_Execute == NULL, "LoadedExecutable_Execute is NULL");
  CHECK(api->PJRT_Compile == NULL, "PJRT_Compile is NULL");
  CHECK(api->PJRT_Client_Compile != NULL, "Client_Compile is set (it reports UNIMPLEMENTED)");
  /* XLA's C++ client (JAX, torch_xla) calls these without a NULL check. */
  CHECK(api->PJRT_Client_TopologyDescription != NULL, "Client_TopologyDescription is set");
  CHECK(api->PJRT_TopologyDescription_PlatformName != NULL, "TopologyDescription_PlatformName is set");
  CHECK(api->PJRT_TopologyDescription_PlatformVersion != NULL, "TopologyDescription_PlatformVersion is set");
  CHECK(api->PJRT_TopologyDescription_Attributes != NULL, "TopologyDescription_Attributes is set");
  CHECK(api->PJRT_TopologyDescription_Serialize != NULL, "TopologyDescription_Serialize is set");
  CHECK(api->PJRT_Buffer_UnpaddedDimensions != NULL, "Buffer_UnpaddedDimensions is set");
  CHECK(api->PJRT_Buffer_DynamicDimensionIndices != NULL, "Buffer_DynamicDimensionIndices is set");
  CHECK(api->PJRT_Buffer_IsOnCpu != NULL, "Buffer_IsOnCpu is set");
  /* ... and these when JAX compiles or copies: the stub answers UNIMPLEMENTED there. */
  PJRT_Device_MemoryStats_Args stats = {.struct_size = PJRT_Device_MemoryStats_Args_STRUCT_SIZE};
  expect_error(api->PJRT_Device_MemoryStats(&stats), PJRT_Error_Code_UNIMPLEMENTED, "memory statistics",
               "Device_MemoryStats");
  PJRT_Buffer_CopyToDevice_Args copy = {.struct_size = PJRT_Buffer_CopyToDevice_Args_STRUCT_SIZE};
  expect_error(api->PJRT_Buffer_CopyToDevice(&copy), PJRT_Error_Code_UNIMPLEMENTED, "copies between devices",
               "Buffer_CopyToDevice");
  PJRT_Buffer_CopyToMemory_Args to_memory = {.struct_size = PJRT_Buffer_CopyToMemory_Args_STRUCT_SIZE};
  expect_error(api->PJRT_Buffer_CopyToMemory(&to_memory), PJRT_Error_Code_UNIMPLEMENTED, "copies between memories",
               "Buffer_CopyToMemory");
  printf("ok   api table %d.%d, %zu bytes\n", api->pjrt_api_version.major_version,
         api->pjrt_api_version.minor_version, api->struct_size);
}

static void check_before_initialize(void) {
  PJRT_Client* client = NULL;
  expect_error(create_client(NULL, 0, &client), PJRT_Error_Code_FAILED_PRECONDITION, "PJRT_Plugin_Initialize",
               "Client_Create before Plugin_Initialize");
  CHECK(client == NULL, "no client before initialize");
}

static void check_initialize_and_attributes(void) {
  PJRT_Plugin_Initialize_Args init = {.struct_size = PJRT_Plugin_Initialize_Args_STRUCT_SIZE};
  ok(api->PJRT_Plugin_Initialize(&init), "PJRT_Plugin_Initialize");
  ok(api->PJRT_Plugin_Initialize(&init), "PJRT_Plugin_Initialize twice");
  PJRT_Plugin_Attributes_Args attrs = {.struct_size = PJRT_Plugin_Attributes_Args_STRUCT_SIZE};
  ok(api->PJRT_Plugin_Attributes(&attrs), "PJRT_Plugin_Attributes");
  bool found_minor = false;
  for (size_t i = 0; i < attrs.num_attributes; ++i) {
    const PJRT_NamedValue* a = &attrs.attributes[i];
    if (a->name_size == strlen("pjrt_c_api_minor_version") && memcmp(a->name, "pjrt_c_api_minor_version", a->name_size) == 0) {
      found_minor = a->type == PJRT_NamedValue_kInt64 && a->int64_value == PJRT_API_MINOR;
    }
  }
  CHECK(found_minor, "attribute pjrt_c_api_minor_version");
  printf("ok   initialize and %zu attributes\n", attrs.num_attributes);
}

static void check_null_and_short_args(void) {
  /* Every implemented function refuses NULL args instead of crashing. */
  expect_error(api->PJRT_Client_Create(NULL), PJRT_Error_Code_INVALID_ARGUMENT, "is NULL", "Client_Create(NULL)");
  expect_error(api->PJRT_Client_Devices(NULL), PJRT_Error_Code_INVALID_ARGUMENT, NULL, "Client_Devices(NULL)");
  expect_error(api->PJRT_Buffer_ToHostBuffer(NULL), PJRT_Error_Code_INVALID_ARGUMENT, NULL, "ToHostBuffer(NULL)");
  expect_error(api->PJRT_Client_BufferFromHostBuffer(NULL), PJRT_Error_Code_INVALID_ARGUMENT, NULL,
               "BufferFromHostBuffer(NULL)");
  expect_error(api->PJRT_Event_Await(NULL), PJRT_Error_Code_INVALID_ARGUMENT, NULL, "Event_Await(NULL)");
  expect_error(api->PJRT_Error_GetCode(NULL), PJRT_Error_Code_INVALID_ARGUMENT, NULL, "Error_GetCode(NULL)");
  api->PJRT_Error_Destroy(NULL); /* void functions simply return */
  api->PJRT_Error_Message(NULL);

  PJRT_Client_Devices_Args devices = {.struct_size = PJRT_Client_Devices_Args_STRUCT_SIZE, .client = NULL};
  expect_error(api->PJRT_Client_Devices(&devices), PJRT_Error_Code_INVALID_ARGUMENT, "client is NULL",
               "Client_Devices(client=NULL)");
  PJRT_Client_Create_Args old = {.struct_size = 16};
  expect_error(api->PJRT_Client_Create(&old), PJRT_Error_Code_INVALID_ARGUMENT, "Unexpected PJRT_Client_Create_Args size",
               "Client_Create with a too-small struct_size");
  /* A caller from before kv_try_get existed is still accepted. */
  PJRT_Client_Create_Args older = {.struct_size = PJRT_STRUCT_SIZE(PJRT_Client_Create_Args, client)};
  if (ok(api->PJRT_Client_Create(&older), "Client_Create with the pre-try_get struct size")) destroy_client(older.client);

  PJRT_Buffer_Dimensions_Args dims = {.struct_size = PJRT_Buffer_Dimensions_Args_STRUCT_SIZE,
                                      .buffer = (PJRT_Buffer*)&devices};
  expect_error(api->PJRT_Buffer_Dimensions(&dims), PJRT_Error_Code_INVALID_ARGUMENT, "not a stub_neuron buffer",
               "Buffer_Dimensions on a pointer that is not a buffer");
}

static void check_options(void) {
  PJRT_Client* client = NULL;
  PJRT_NamedValue wrong_type = {.struct_size = PJRT_NamedValue_STRUCT_SIZE,
                                .name = "num_devices",
                                .name_size = 11,
                                .type = PJRT_NamedValue_kString,
                                .string_value = "8",
                                .value_size = 1};
  expect_error(create_client(&wrong_type, 1, &client), PJRT_Error_Code_INVALID_ARGUMENT, "must be an int64, got a string",
               "num_devices given as a string");
  PJRT_NamedValue unknown = int_option("cpu_device_count", 8);
  expect_error(create_client(&unknown, 1, &client), PJRT_Error_Code_INVALID_ARGUMENT, "unknown create option 'cpu_device_count'",
               "unknown option");
  PJRT_NamedValue zero = int_option("num_devices", 0);
  expect_error(create_client(&zero, 1, &client), PJRT_Error_Code_INVALID_ARGUMENT, "out of range", "num_devices=0");
  PJRT_NamedValue twice[2] = {int_option("num_devices", 2), int_option("num_devices", 3)};
  expect_error(create_client(twice, 2, &client), PJRT_Error_Code_INVALID_ARGUMENT, "given twice", "duplicate option");
  expect_error(create_client(NULL, 3, &client), PJRT_Error_Code_INVALID_ARGUMENT, "create_options is NULL",
               "options NULL with a count");
  PJRT_NamedValue no_node[1] = {int_option("num_nodes", 2)};
  expect_error(create_client(no_node, 1, &client), PJRT_Error_Code_INVALID_ARGUMENT, "node_id is required",
               "num_nodes without node_id");
  PJRT_NamedValue bad_node[2] = {int_option("num_nodes", 2), int_option("node_id", 2)};
  expect_error(create_client(bad_node, 2, &client), PJRT_Error_Code_INVALID_ARGUMENT, "node_id=2 is out of range",
               "node_id out of range");
  PJRT_NamedValue no_kv[2] = {int_option("num_nodes", 2), int_option("node_id", 0)};
  expect_error(create_client(no_kv, 2, &client), PJRT_Error_Code_INVALID_ARGUMENT, "needs the KV store callbacks",
               "num_nodes=2 without KV callbacks");
  PJRT_NamedValue short_value = int_option("num_devices", 2);
  short_value.struct_size = 8;
  expect_error(create_client(&short_value, 1, &client), PJRT_Error_Code_INVALID_ARGUMENT, "PJRT_NamedValue size",
               "option with a too-small struct_size");
  CHECK(client == NULL, "no client after failed creates");
}

static void check_client_and_devices(void) {
  PJRT_NamedValue options[1] = {int_option("num_devices", 6)};
  PJRT_Client* client = NULL;
  if (!ok(create_client(options, 1, &client), "Client_Create num_devices=6")) return;

  PJRT_Client_PlatformName_Args name = {.struct_size = PJRT_Client_PlatformName_Args_STRUCT_SIZE, .client = client};
  ok(api->PJRT_Client_PlatformName(&name), "PlatformName");
  CHECK(name.platform_name_size == 6 && memcmp(name.platform_name, "neuron", 6) == 0, "platform is neuron");
  PJRT_Client_PlatformVersion_Args version = {.struct_size = PJRT_Client_PlatformVersion_Args_STRUCT_SIZE,
                                              .client = client};
  ok(api->PJRT_Client_PlatformVersion(&version), "PlatformVersion");
  CHECK(version.platform_version_size > 0, "platform version is set");
  PJRT_Client_ProcessIndex_Args process = {.struct_size = PJRT_Client_ProcessIndex_Args_STRUCT_SIZE, .client = client};
  ok(api->PJRT_Client_ProcessIndex(&process), "ProcessIndex");
  CHECK(process.process_index == 0, "process index 0");

  size_t n = 0, na = 0;
  PJRT_Device* const* devices = all_devices(client, &n);
  PJRT_Device* const* local = addressable_devices(client, &na);
  CHECK(n == 6 && na == 6, "6 devices, got %zu / %zu addressable", n, na);
  for (size_t i = 0; i < n; ++i) {
    PJRT_Device* d = devices[i];
    CHECK(device_id(d) == (int)i, "device %zu id", i);
    CHECK(device_process(d) == 0, "device %zu process index", i);
    PJRT_DeviceDescription_Kind_Args kind = {.struct_size = PJRT_DeviceDescription_Kind_Args_STRUCT_SIZE,
                                             .device_description = description_of(d)};
    ok(api->PJRT_DeviceDescription_Kind(&kind), "Kind");
    CHECK(kind.device_kind_size > 0 && strstr(kind.device_kind, "NeuronCore") != NULL, "device kind");
    PJRT_DeviceDescription_ToString_Args str = {.struct_size = PJRT_DeviceDescription_ToString_Args_STRUCT_SIZE,
                                                .device_description = description_of(d)};
    ok(api->PJRT_DeviceDescription_ToString(&str), "ToString");
    char expected[64];
    snprintf(expected, sizeof expected, "NeuronDevice(id=%zu)", i);
    CHECK(str.to_string_size == strlen(expected) && memcmp(str.to_string, expected, str.to_string_size) == 0,
          "ToString %.*s", (int)str.to_string_size, str.to_string);
    PJRT_DeviceDescription_DebugString_Args dbg = {.struct_size = PJRT_DeviceDescription_DebugString_Args_STRUCT_SIZE,
                                                   .device_description = description_of(d)};
    ok(api->PJRT_DeviceDescription_DebugString(&dbg), "DebugString");
    PJRT_DeviceDescription_Attributes_Args attrs = {.struct_size = PJRT_DeviceDescription_Attributes_Args_STRUCT_SIZE,
                                                    .device_description = description_of(d)};
    ok(api->PJRT_DeviceDescription_Attributes(&attrs), "Attributes");
    CHECK(attrs.num_attributes == 3 && attrs.attributes[0].int64_value == (int64_t)i, "core_index attribute");
    PJRT_Device_IsAddressable_Args addr = {.struct_size = PJRT_Device_IsAddressable_Args_STRUCT_SIZE, .device = d};
    ok(api->PJRT_Device_IsAddressable(&addr), "IsAddressable");
    CHECK(addr.is_addressable, "addressable");
    PJRT_Device_LocalHardwareId_Args hw = {.struct_size = PJRT_Device_LocalHardwareId_Args_STRUCT_SIZE, .device = d};
    ok(api->PJRT_Device_LocalHardwareId(&hw), "LocalHardwareId");
    CHECK(hw.local_hardware_id == (int)i, "local hardware id");
    PJRT_Device_DefaultMemory_Args mem = {.struct_size = PJRT_Device_DefaultMemory_Args_STRUCT_SIZE, .device = d};
    ok(api->PJRT_Device_DefaultMemory(&mem), "DefaultMemory");
    PJRT_Device_AddressableMemories_Args mems = {.struct_size = PJRT_Device_AddressableMemories_Args_STRUCT_SIZE,
                                                 .device = d};
    ok(api->PJRT_Device_AddressableMemories(&mems), "Device_AddressableMemories");
    CHECK(mems.num_memories == 1 && mems.memories[0] == mem.memory, "one memory, the default");
    PJRT_Memory_Kind_Args mk = {.struct_size = PJRT_Memory_Kind_Args_STRUCT_SIZE, .memory = mem.memory};
    ok(api->PJRT_Memory_Kind(&mk), "Memory_Kind");
    CHECK(mk.kind_size == 6 && memcmp(mk.kind, "device", 6) == 0, "memory kind");
    PJRT_Memory_Id_Args mid = {.struct_size = PJRT_Memory_Id_Args_STRUCT_SIZE, .memory = mem.memory};
    ok(api->PJRT_Memory_Id(&mid), "Memory_Id");
    CHECK(mid.id == (int)i, "memory id");
    PJRT_Memory_AddressableByDevices_Args by = {.struct_size = PJRT_Memory_AddressableByDevices_Args_STRUCT_SIZE,
                                                .memory = mem.memory};
    ok(api->PJRT_Memory_AddressableByDevices(&by), "AddressableByDevices");
    CHECK(by.num_devices == 1 && by.devices[0] == d, "memory addressable by its device");
    PJRT_Memory_ToString_Args ms = {.struct_size = PJRT_Memory_ToString_Args_STRUCT_SIZE, .memory = mem.memory};
    ok(api->PJRT_Memory_ToString(&ms), "Memory_ToString");
    PJRT_Memory_DebugString_Args md = {.struct_size = PJRT_Memory_DebugString_Args_STRUCT_SIZE, .memory = mem.memory};
    ok(api->PJRT_Memory_DebugString(&md), "Memory_DebugString");
    CHECK(local[i] == d, "addressable device %zu", i);
  }
  PJRT_Client_AddressableMemories_Args cm = {.struct_size = PJRT_Client_AddressableMemories_Args_STRUCT_SIZE,
                                             .client = client};
  ok(api->PJRT_Client_AddressableMemories(&cm), "Client_AddressableMemories");
  CHECK(cm.num_addressable_memories == 6, "6 memories");

  PJRT_Client_LookupDevice_Args look = {.struct_size = PJRT_Client_LookupDevice_Args_STRUCT_SIZE, .client = client,
                                        .id = 5};
  ok(api->PJRT_Client_LookupDevice(&look), "LookupDevice 5");
  CHECK(look.device == devices[5], "lookup 5");
  look.id = 6;
  expect_error(api->PJRT_Client_LookupDevice(&look), PJRT_Error_Code_NOT_FOUND, "id 6", "LookupDevice 6");
  look.id = -1;
  expect_error(api->PJRT_Client_LookupDevice(&look), PJRT_Error_Code_NOT_FOUND, NULL, "LookupDevice -1");
  PJRT_Client_LookupAddressableDevice_Args la = {.struct_size = PJRT_Client_LookupAddressableDevice_Args_STRUCT_SIZE,
                                                 .client = client,
                                                 .local_hardware_id = 2};
  ok(api->PJRT_Client_LookupAddressableDevice(&la), "LookupAddressableDevice 2");
  CHECK(la.addressable_device == devices[2], "lookup addressable 2");

  PJRT_Program program = {.struct_size = PJRT_Program_STRUCT_SIZE, .code = "module {}", .code_size = 9,
                          .format = "mlir", .format_size = 4};
  PJRT_Client_Compile_Args compile = {.struct_size = PJRT_Client_Compile_Args_STRUCT_SIZE, .client = client,
                                      .program = &program};
  expect_error(api->PJRT_Client_Compile(&compile), PJRT_Error_Code_UNIMPLEMENTED, "no compiler", "Client_Compile");
  CHECK(compile.executable == NULL, "no executable");

  destroy_client(client);
  PJRT_Client_Destroy_Args again = {.struct_size = PJRT_Client_Destroy_Args_STRUCT_SIZE, .client = NULL};
  ok(api->PJRT_Client_Destroy(&again), "Client_Destroy(NULL client) is a no-op");
  printf("ok   client with 6 devices\n");
}

/* The client's topology (XLA's C++ client reads it when it creates a client). */
static void check_topology(void) {
  PJRT_NamedValue options[1] = {int_option("num_devices", 3)};
  PJRT_Client* client = NULL;
  if (!ok(create_client(options, 1, &client), "Client_Create num_devices=3")) return;
  PJRT_Client_TopologyDescription_Args get = {.struct_size = PJRT_Client_TopologyDescription_Args_STRUCT_SIZE,
                                              .client = client};
  if (ok(api->PJRT_Client_TopologyDescription(&get), "Client_TopologyDescription") && get.topology != NULL) {
    PJRT_TopologyDescription* topology = get.topology;
    PJRT_TopologyDescription_PlatformName_Args name = {
        .struct_size = PJRT_TopologyDescription_PlatformName_Args_STRUCT_SIZE, .topology = topology};
    ok(api->PJRT_TopologyDescription_PlatformName(&name), "TopologyDescription_PlatformName");
    CHECK(name.platform_name_size == 6 && memcmp(name.platform_name, "neuron", 6) == 0, "topology platform");
    PJRT_TopologyDescription_PlatformVersion_Args version = {
        .struct_size = PJRT_TopologyDescription_PlatformVersion_Args_STRUCT_SIZE, .topology = topology};
    ok(api->PJRT_TopologyDescription_PlatformVersion(&version), "TopologyDescription_PlatformVersion");
    CHECK(version.platform_version_size > 0, "topology platform version");
    PJRT_TopologyDescription_GetDeviceDescriptions_Args descriptions = {
        .struct_size = PJRT_TopologyDescription_GetDeviceDescriptions_Args_STRUCT_SIZE, .topology = topology};
    ok(api->PJRT_TopologyDescription_GetDeviceDescriptions(&descriptions), "GetDeviceDescriptions");
    CHECK(descriptions.num_descriptions == 3, "3 device descriptions, got %zu", descriptions.num_descriptions);
    for (size_t i = 0; i < descriptions.num_descriptions; ++i) {
      PJRT_DeviceDescription_Id_Args id = {.struct_size = PJRT_DeviceDescription_Id_Args_STRUCT_SIZE,
                                           .device_description = descriptions.descriptions[i]};
      ok(api->PJRT_DeviceDescription_Id(&id), "topology description Id");
      CHECK(id.id == (int)i, "topology description %zu has id %d", i, id.id);
    }
    PJRT_TopologyDescription_Attributes_Args attributes = {
        .struct_size = PJRT_TopologyDescription_Attributes_Args_STRUCT_SIZE, .topology = topology};
    ok(api->PJRT_TopologyDescription_Attributes(&attributes), "TopologyDescription_Attributes");
    CHECK(attributes.num_attributes == 2 && attributes.attributes[1].int64_value == 3, "topology attributes");
    PJRT_TopologyDescription_Serialize_Args serialized = {
        .struct_size = PJRT_TopologyDescription_Serialize_Args_STRUCT_SIZE, .topology = topology};
    if (ok(api->PJRT_TopologyDescription_Serialize(&serialized), "TopologyDescription_Serialize")) {
      CHECK(serialized.serialized_bytes_size > 0 && serialized.serialized_topology_deleter != NULL,
            "serialized topology");
      serialized.serialized_topology_deleter(serialized.serialized_topology);
    }
    PJRT_TopologyDescription_Destroy_Args destroy = {.struct_size = PJRT_TopologyDescription_Destroy_Args_STRUCT_SIZE,
                                                     .topology = topology};
    expect_error(api->PJRT_TopologyDescription_Destroy(&destroy), PJRT_Error_Code_INVALID_ARGUMENT, "belongs to its client",
                 "TopologyDescription_Destroy of the client's topology");
  }
  PJRT_TopologyDescription_PlatformName_Args bad = {
      .struct_size = PJRT_TopologyDescription_PlatformName_Args_STRUCT_SIZE, .topology = NULL};
  expect_error(api->PJRT_TopologyDescription_PlatformName(&bad), PJRT_Error_Code_INVALID_ARGUMENT, "is NULL",
               "TopologyDescription_PlatformName(NULL topology)");

  destroy_client(client);
  printf("ok   topology\n");
}

static void check_events(void) {
  PJRT_Event_OnReady_Args none = {.struct_size = PJRT_Event_OnReady_Args_STRUCT_SIZE, .event = NULL};
  expect_error(api->PJRT_Event_OnReady(&none), PJRT_Error_Code_INVALID_ARGUMENT, "event is NULL", "OnReady(NULL event)");
  PJRT_Event_Destroy_Args destroy_null = {.struct_size = PJRT_Event_Destroy_Args_STRUCT_SIZE, .event = NULL};
  ok(api->PJRT_Event_Destroy(&destroy_null), "Event_Destroy(NULL event) is a no-op");
}

static int on_ready_calls;
static void on_ready(PJRT_Error* error, void* user_arg) {
  on_ready_calls += error == NULL && user_arg == (void*)&on_ready_calls;
  if (error != NULL) {
    *(int*)user_arg = -1000;
    destroy_error(error);
  }
}

static int deleted_ready_code;
static void on_ready_deleted(PJRT_Error* error, void* user_arg) {
  deleted_ready_code = error != NULL ? (int)code_of(error) : 0;
  if (error != NULL) destroy_error(error);
}

typedef struct {
  PJRT_Buffer_Type type;
  size_t size;
  const char* name;
} TypeCase;

static void check_buffers(void) {
  PJRT_Client* client = NULL;
  if (!ok(create_client(NULL, 0, &client), "Client_Create default")) return;
  size_t n = 0;
  PJRT_Device* const* devices = addressable_devices(client, &n);
  CHECK(n == 4, "default is 4 devices, got %zu", n);

  /* Every element type round-trips bit-exactly. */
  static const TypeCase types[] = {
      {PJRT_Buffer_Type_PRED, 1, "pred"}, {PJRT_Buffer_Type_S8, 1, "s8"},     {PJRT_Buffer_Type_S16, 2, "s16"},
      {PJRT_Buffer_Type_S32, 4, "s32"},   {PJRT_Buffer_Type_S64, 8, "s64"},   {PJRT_Buffer_Type_U8, 1, "u8"},
      {PJRT_Buffer_Type_U16, 2, "u16"},   {PJRT_Buffer_Type_U32, 4, "u32"},   {PJRT_Buffer_Type_U64, 8, "u64"},
      {PJRT_Buffer_Type_F16, 2, "f16"},   {PJRT_Buffer_Type_F32, 4, "f32"},   {PJRT_Buffer_Type_F64, 8, "f64"},
      {PJRT_Buffer_Type_BF16, 2, "bf16"}, {PJRT_Buffer_Type_C64, 8, "c64"},   {PJRT_Buffer_Type_C128, 16, "c128"},
      {PJRT_Buffer_Type_F8E5M2, 1, "f8e5m2"}, {PJRT_Buffer_Type_F8E4M3FN, 1, "f8e4m3fn"},
      {PJRT_Buffer_Type_S4, 1, "s4"},     {PJRT_Buffer_Type_U4, 1, "u4"},
  };
  const int64_t dims[3] = {2, 3, 5};
  for (size_t t = 0; t < sizeof types / sizeof types[0]; ++t) {
    size_t bytes = 30 * types[t].size;
    unsigned char* src = malloc(bytes);
    unsigned char* dst = malloc(bytes);
    for (size_t i = 0; i < bytes; ++i) src[i] = (unsigned char)(i * 7 + t);
    PJRT_Buffer* buffer = NULL;
    if (ok(upload(client, devices[t % n], src, types[t].type, dims, 3, NULL, 0, &buffer), types[t].name)) {
      PJRT_Buffer_ElementType_Args et = {.struct_size = PJRT_Buffer_ElementType_Args_STRUCT_SIZE, .buffer = buffer};
      ok(api->PJRT_Buffer_ElementType(&et), "ElementType");
      CHECK(et.type == types[t].type, "%s element type", types[t].name);
      PJRT_Buffer_OnDeviceSizeInBytes_Args sz = {.struct_size = PJRT_Buffer_OnDeviceSizeInBytes_Args_STRUCT_SIZE,
                                                 .buffer = buffer};
      ok(api->PJRT_Buffer_OnDeviceSizeInBytes(&sz), "OnDeviceSizeInBytes");
      CHECK(sz.on_device_size_in_bytes == bytes, "%s size", types[t].name);
      PJRT_Buffer_Device_Args dev = {.struct_size = PJRT_Buffer_Device_Args_STRUCT_SIZE, .buffer = buffer};
      ok(api->PJRT_Buffer_Device(&dev), "Buffer_Device");
      CHECK(dev.device == devices[t % n], "%s device", types[t].name);
      if (t == 0) { /* the metadata XLA's C++ client asks for */
        PJRT_Buffer_UnpaddedDimensions_Args unpadded = {
            .struct_size = PJRT_Buffer_UnpaddedDimensions_Args_STRUCT_SIZE, .buffer = buffer};
        ok(api->PJRT_Buffer_UnpaddedDimensions(&unpadded), "UnpaddedDimensions");
        CHECK(unpadded.num_dims == 3 && unpadded.unpadded_dims[2] == 5, "unpadded dims are the dims");
        PJRT_Buffer_DynamicDimensionIndices_Args dynamic = {
            .struct_size = PJRT_Buffer_DynamicDimensionIndices_Args_STRUCT_SIZE, .buffer = buffer};
        ok(api->PJRT_Buffer_DynamicDimensionIndices(&dynamic), "DynamicDimensionIndices");
        CHECK(dynamic.num_dynamic_dims == 0, "no dynamic dimensions");
        PJRT_Buffer_GetMemoryLayout_Args layout = {.struct_size = PJRT_Buffer_GetMemoryLayout_Args_STRUCT_SIZE,
                                                   .buffer = buffer};
        ok(api->PJRT_Buffer_GetMemoryLayout(&layout), "GetMemoryLayout");
        CHECK(layout.layout.type == PJRT_Buffer_MemoryLayout_Type_Tiled && layout.layout.tiled.minor_to_major_size == 3 &&
                  layout.layout.tiled.minor_to_major[0] == 2 && layout.layout.tiled.minor_to_major[2] == 0 &&
                  layout.layout.tiled.num_tiles == 0,
              "default layout is major-to-minor");
        PJRT_Buffer_IsOnCpu_Args on_cpu = {.struct_size = PJRT_Buffer_IsOnCpu_Args_STRUCT_SIZE, .buffer = buffer};
        ok(api->PJRT_Buffer_IsOnCpu(&on_cpu), "IsOnCpu");
        CHECK(!on_cpu.is_on_cpu, "stub buffers are not the caller's host memory");
      }
      PJRT_Buffer_ToHostBuffer_Args query = {.struct_size = PJRT_Buffer_ToHostBuffer_Args_STRUCT_SIZE, .src = buffer};
      ok(api->PJRT_Buffer_ToHostBuffer(&query), "ToHostBuffer size query");
      CHECK(query.dst_size == bytes && query.event == NULL, "%s size query", types[t].name);
      memset(dst, 0, bytes);
      ok(download(buffer, dst, bytes), "ToHostBuffer");
      CHECK(memcmp(src, dst, bytes) == 0, "%s round trip", types[t].name);
      destroy_buffer(buffer);
    }
    free(src);
    free(dst);
  }
  printf("ok   %zu element types round-trip\n", sizeof types / sizeof types[0]);

  /* Byte strides: a transposed (column-major) 3x4 float array, and a reversed one. */
  float colmajor[12];
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) colmajor[j * 3 + i] = (float)(i * 10 + j);
  const int64_t d34[2] = {3, 4};
  const int64_t s34[2] = {4, 12};
  PJRT_Buffer* strided = NULL;
  if (ok(upload(client, devices[1], colmajor, PJRT_Buffer_Type_F32, d34, 2, s34, 2, &strided), "strided upload")) {
    float out[12];
    ok(download(strided, out, sizeof out), "strided download");
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 4; ++j) CHECK(out[i * 4 + j] == (float)(i * 10 + j), "strided [%d,%d]=%g", i, j, out[i * 4 + j]);
    destroy_buffer(strided);
  }
  int32_t forward[5] = {1, 2, 3, 4, 5};
  const int64_t d5[1] = {5};
  const int64_t back[1] = {-4};
  PJRT_Buffer* reversed = NULL;
  if (ok(upload(client, devices[0], &forward[4], PJRT_Buffer_Type_S32, d5, 1, back, 1, &reversed), "negative stride")) {
    int32_t out[5];
    ok(download(reversed, out, sizeof out), "negative stride download");
    CHECK(out[0] == 5 && out[4] == 1, "reversed %d..%d", out[0], out[4]);
    destroy_buffer(reversed);
  }
  int64_t wide[4][6];
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 6; ++j) wide[i][j] = i * 100 + j;
  const int64_t d22[2] = {2, 3};
  const int64_t every_other[2] = {2 * 6 * 8, 2 * 8}; /* rows 0,2 and columns 0,2,4 */
  PJRT_Buffer* sliced = NULL;
  if (ok(upload(client, devices[0], wide, PJRT_Buffer_Type_S64, d22, 2, every_other, 2, &sliced), "sliced")) {
    int64_t out[6];
    ok(download(sliced, out, sizeof out), "sliced download");
    CHECK(out[0] == 0 && out[1] == 2 && out[2] == 4 && out[3] == 200 && out[5] == 204, "sliced values");
    destroy_buffer(sliced);
  }
  printf("ok   byte strides (transposed, negative, sliced)\n");

  /* Scalars and empty arrays. */
  double pi = 3.25, got = 0;
  PJRT_Buffer* scalar = NULL;
  if (ok(upload(client, devices[0], &pi, PJRT_Buffer_Type_F64, NULL, 0, NULL, 0, &scalar), "scalar")) {
    PJRT_Buffer_Dimensions_Args dd = {.struct_size = PJRT_Buffer_Dimensions_Args_STRUCT_SIZE, .buffer = scalar};
    ok(api->PJRT_Buffer_Dimensions(&dd), "scalar dims");
    CHECK(dd.num_dims == 0, "scalar rank 0");
    ok(download(scalar, &got, sizeof got), "scalar download");
    CHECK(got == 3.25, "scalar value");
    destroy_buffer(scalar);
  }
  const int64_t empty_dims[2] = {0, 7};
  PJRT_Buffer* empty = NULL;
  if (ok(upload(client, devices[0], NULL, PJRT_Buffer_Type_F32, empty_dims, 2, NULL, 0, &empty), "empty")) {
    PJRT_Buffer_Dimensions_Args dd = {.struct_size = PJRT_Buffer_Dimensions_Args_STRUCT_SIZE, .buffer = empty};
    ok(api->PJRT_Buffer_Dimensions(&dd), "empty dims");
    CHECK(dd.num_dims == 2 && dd.dims[0] == 0 && dd.dims[1] == 7, "empty dims values");
    char nothing[1];
    ok(download(empty, nothing, 0), "empty download");
    destroy_buffer(empty);
  }

  /* Bad uploads are errors. */
  float one = 1;
  const int64_t neg[1] = {-1};
  PJRT_Buffer* bad = NULL;
  expect_error(upload(client, devices[0], &one, PJRT_Buffer_Type_F32, neg, 1, NULL, 0, &bad),
               PJRT_Error_Code_INVALID_ARGUMENT, "negative", "negative dimension");
  expect_error(upload(client, devices[0], &one, PJRT_Buffer_Type_TOKEN, NULL, 0, NULL, 0, &bad),
               PJRT_Error_Code_INVALID_ARGUMENT, "not supported", "TOKEN element type");
  expect_error(upload(client, devices[0], &one, (PJRT_Buffer_Type)999, NULL, 0, NULL, 0, &bad),
               PJRT_Error_Code_INVALID_ARGUMENT, "not supported", "element type 999");
  expect_error(upload(client, devices[0], NULL, PJRT_Buffer_Type_F32, d5, 1, NULL, 0, &bad),
               PJRT_Error_Code_INVALID_ARGUMENT, "data is NULL", "NULL data");
  expect_error(upload(client, devices[0], forward, PJRT_Buffer_Type_S32, d5, 1, s34, 2, &bad),
               PJRT_Error_Code_INVALID_ARGUMENT, "byte strides", "stride count mismatch");
  expect_error(upload(client, NULL, &one, PJRT_Buffer_Type_F32, NULL, 0, NULL, 0, &bad),
               PJRT_Error_Code_INVALID_ARGUMENT, "set device or memory", "no device");
  expect_error(upload(client, (PJRT_Device*)&one, &one, PJRT_Buffer_Type_F32, NULL, 0, NULL, 0, &bad),
               PJRT_Error_Code_INVALID_ARGUMENT, "does not belong", "foreign device");
  CHECK(bad == NULL, "no buffer from bad uploads");

  /* Upload into a memory instead of a device. */
  PJRT_Device_DefaultMemory_Args mem = {.struct_size = PJRT_Device_DefaultMemory_Args_STRUCT_SIZE, .device = devices[3]};
  ok(api->PJRT_Device_DefaultMemory(&mem), "DefaultMemory");
  PJRT_Client_BufferFromHostBuffer_Args to_memory = {
      .struct_size = PJRT_Client_BufferFromHostBuffer_Args_STRUCT_SIZE,
      .client = client, .data = &one, .type = PJRT_Buffer_Type_F32,
      .host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableZeroCopy, .memory = mem.memory};
  if (ok(api->PJRT_Client_BufferFromHostBuffer(&to_memory), "upload to a memory")) {
    destroy_event(to_memory.done_with_host_buffer);
    PJRT_Buffer_Memory_Args bm = {.struct_size = PJRT_Buffer_Memory_Args_STRUCT_SIZE, .buffer = to_memory.buffer};
    ok(api->PJRT_Buffer_Memory(&bm), "Buffer_Memory");
    CHECK(bm.memory == mem.memory, "buffer in that memory");
    PJRT_Buffer_Device_Args bd = {.struct_size = PJRT_Buffer_Device_Args_STRUCT_SIZE, .buffer = to_memory.buffer};
    ok(api->PJRT_Buffer_Device(&bd), "Buffer_Device");
    CHECK(bd.device == devices[3], "buffer on the memory's device");
    destroy_buffer(to_memory.buffer);
  }

  /* Download errors, events, delete. */
  PJRT_Buffer* buffer = NULL;
  int32_t five[5] = {9, 8, 7, 6, 5};
  if (ok(upload(client, devices[2], five, PJRT_Buffer_Type_S32, d5, 1, NULL, 0, &buffer), "upload five")) {
    int32_t small[2];
    expect_error(download(buffer, small, sizeof small), PJRT_Error_Code_INVALID_ARGUMENT, "dst_size", "dst too small");
    PJRT_Buffer_MemoryLayout layout = {.struct_size = PJRT_Buffer_MemoryLayout_STRUCT_SIZE,
                                       .type = PJRT_Buffer_MemoryLayout_Type_Strides};
    layout.strides.struct_size = PJRT_Buffer_MemoryLayout_Strides_STRUCT_SIZE;
    const int64_t backwards[1] = {-4};
    layout.strides.byte_strides = backwards;
    layout.strides.num_byte_strides = 1;
    int32_t out[5];
    PJRT_Buffer_ToHostBuffer_Args odd = {.struct_size = PJRT_Buffer_ToHostBuffer_Args_STRUCT_SIZE, .src = buffer,
                                         .host_layout = &layout, .dst = out, .dst_size = sizeof out};
    expect_error(api->PJRT_Buffer_ToHostBuffer(&odd), PJRT_Error_Code_UNIMPLEMENTED, "dense", "non-dense host layout");
    const int64_t forward_stride[1] = {4};
    layout.strides.byte_strides = forward_stride;
    if (ok(api->PJRT_Buffer_ToHostBuffer(&odd), "dense strides host layout")) destroy_event(odd.event);
    /* As XLA's C++ client passes it: type and tiled fields set, every struct_size left as the stack had it. */
    const int64_t row_major[1] = {0};
    PJRT_Buffer_MemoryLayout xla_style;
    memset(&xla_style, 0xA5, sizeof xla_style);
    xla_style.struct_size = 1;
    xla_style.type = PJRT_Buffer_MemoryLayout_Type_Tiled;
    xla_style.tiled.minor_to_major = row_major;
    xla_style.tiled.minor_to_major_size = 1;
    xla_style.tiled.num_tiles = 0;
    odd.host_layout = &xla_style;
    memset(out, 0, sizeof out);
    if (ok(api->PJRT_Buffer_ToHostBuffer(&odd), "host layout with unset struct_size (as XLA's client sends)")) {
      destroy_event(odd.event);
      CHECK(out[0] == 9 && out[4] == 5, "read back with that layout");
    }

    PJRT_Buffer_ReadyEvent_Args ready = {.struct_size = PJRT_Buffer_ReadyEvent_Args_STRUCT_SIZE, .buffer = buffer};
    ok(api->PJRT_Buffer_ReadyEvent(&ready), "ReadyEvent");
    PJRT_Event_OnReady_Args cb = {.struct_size = PJRT_Event_OnReady_Args_STRUCT_SIZE, .event = ready.event,
                                  .callback = on_ready, .user_arg = &on_ready_calls};
    ok(api->PJRT_Event_OnReady(&cb), "OnReady");
    CHECK(on_ready_calls == 1, "OnReady ran once with no error");
    PJRT_Event_Error_Args ee = {.struct_size = PJRT_Event_Error_Args_STRUCT_SIZE, .event = ready.event};
    ok(api->PJRT_Event_Error(&ee), "Event_Error of a good event");
    destroy_event(ready.event);

    PJRT_Buffer_Delete_Args del = {.struct_size = PJRT_Buffer_Delete_Args_STRUCT_SIZE, .buffer = buffer};
    ok(api->PJRT_Buffer_Delete(&del), "Delete");
    ok(api->PJRT_Buffer_Delete(&del), "Delete twice");
    PJRT_Buffer_IsDeleted_Args isdel = {.struct_size = PJRT_Buffer_IsDeleted_Args_STRUCT_SIZE, .buffer = buffer};
    ok(api->PJRT_Buffer_IsDeleted(&isdel), "IsDeleted");
    CHECK(isdel.is_deleted, "is deleted");
    expect_error(download(buffer, out, sizeof out), PJRT_Error_Code_FAILED_PRECONDITION, "deleted",
                 "download after delete");
    ok(api->PJRT_Buffer_ReadyEvent(&ready), "ReadyEvent after delete");
    PJRT_Event_Await_Args aw = {.struct_size = PJRT_Event_Await_Args_STRUCT_SIZE, .event = ready.event};
    expect_error(api->PJRT_Event_Await(&aw), PJRT_Error_Code_FAILED_PRECONDITION, "deleted", "Await after delete");
    PJRT_Event_Error_Args ee2 = {.struct_size = PJRT_Event_Error_Args_STRUCT_SIZE, .event = ready.event};
    expect_error(api->PJRT_Event_Error(&ee2), PJRT_Error_Code_FAILED_PRECONDITION, "deleted", "Event_Error after delete");
    PJRT_Event_OnReady_Args cb2 = {.struct_size = PJRT_Event_OnReady_Args_STRUCT_SIZE, .event = ready.event,
                                   .callback = on_ready_deleted};
    ok(api->PJRT_Event_OnReady(&cb2), "OnReady after delete");
    CHECK(deleted_ready_code == PJRT_Error_Code_FAILED_PRECONDITION, "OnReady got the error");
    destroy_event(ready.event);
    destroy_buffer(buffer);
  }

  /* A buffer outlives its client's Destroy and stays readable. */
  PJRT_Buffer* survivor = NULL;
  ok(upload(client, devices[1], five, PJRT_Buffer_Type_S32, d5, 1, NULL, 0, &survivor), "survivor upload");
  destroy_client(client);
  PJRT_Client_Destroy_Args twice = {.struct_size = PJRT_Client_Destroy_Args_STRUCT_SIZE, .client = client};
  expect_error(api->PJRT_Client_Destroy(&twice), PJRT_Error_Code_FAILED_PRECONDITION, "already destroyed",
               "Client_Destroy twice while a buffer keeps it alive");
  if (survivor != NULL) {
    int32_t out[5] = {0};
    ok(download(survivor, out, sizeof out), "download after Client_Destroy");
    CHECK(out[0] == 9 && out[4] == 5, "survivor values");
    PJRT_Buffer_Device_Args bd = {.struct_size = PJRT_Buffer_Device_Args_STRUCT_SIZE, .buffer = survivor};
    ok(api->PJRT_Buffer_Device(&bd), "Buffer_Device after Client_Destroy");
    CHECK(device_id(bd.device) == 1, "survivor device");
    destroy_buffer(survivor);
  }
  printf("ok   buffers\n");
}

/* ------------------------- a fake in-process KV store ----------------------- */

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  char keys[64][64];
  char values[64][64];
  int count;
  bool fail_puts;
} FakeKvStore;

static void fake_kv_free(char* value) { free(value); }

static PJRT_Error* fake_kv_put(PJRT_KeyValuePutCallback_Args* args) {
  FakeKvStore* store = args->user_arg;
  if (store->fail_puts) {
    const char* msg = "the store is read-only";
    return (*args->callback_error)(PJRT_Error_Code_PERMISSION_DENIED, msg, strlen(msg));
  }
  pthread_mutex_lock(&store->mu);
  int slot = store->count++;
  snprintf(store->keys[slot], 64, "%.*s", (int)args->key_size, args->key);
  snprintf(store->values[slot], 64, "%.*s", (int)args->value_size, args->value);
  pthread_cond_broadcast(&store->cv);
  pthread_mutex_unlock(&store->mu);
  return NULL;
}

static PJRT_Error* fake_kv_get(PJRT_KeyValueGetCallback_Args* args) {
  FakeKvStore* store = args->user_arg;
  char key[64];
  snprintf(key, sizeof key, "%.*s", (int)args->key_size, args->key);
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += args->timeout_in_ms / 1000;
  deadline.tv_nsec += (long)(args->timeout_in_ms % 1000) * 1000000L;
  if (deadline.tv_nsec >= 1000000000L) {
    deadline.tv_sec += 1;
    deadline.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&store->mu);
  for (;;) {
    for (int i = 0; i < store->count; ++i) {
      if (strcmp(store->keys[i], key) == 0) {
        size_t n = strlen(store->values[i]);
        args->value = malloc(n);
        memcpy(args->value, store->values[i], n);
        args->value_size = n;
        args->value_deleter_callback = fake_kv_free;
        pthread_mutex_unlock(&store->mu);
        return NULL;
      }
    }
    if (pthread_cond_timedwait(&store->cv, &store->mu, &deadline) != 0) break;
  }
  pthread_mutex_unlock(&store->mu);
  char msg[128];
  snprintf(msg, sizeof msg, "key %s not found after %d ms", key, args->timeout_in_ms);
  return (*args->callback_error)(PJRT_Error_Code_DEADLINE_EXCEEDED, msg, strlen(msg));
}

typedef struct {
  FakeKvStore* store;
  int node_id, num_nodes, num_devices, timeout_ms;
  PJRT_Client* client;
  PJRT_Error* error;
} NodeArgs;

static void* create_node(void* p) {
  NodeArgs* node = p;
  PJRT_NamedValue options[4] = {int_option("num_devices", node->num_devices), int_option("node_id", node->node_id),
                                int_option("num_nodes", node->num_nodes),
                                int_option("kv_timeout_ms", node->timeout_ms)};
  PJRT_Client_Create_Args args = {.struct_size = PJRT_Client_Create_Args_STRUCT_SIZE,
                                  .create_options = options,
                                  .num_options = 4,
                                  .kv_get_callback = fake_kv_get,
                                  .kv_get_user_arg = node->store,
                                  .kv_put_callback = fake_kv_put,
                                  .kv_put_user_arg = node->store};
  node->error = api->PJRT_Client_Create(&args);
  node->client = args.client;
  return NULL;
}

static void check_multi_node(void) {
  FakeKvStore store = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
  enum { NODES = 3 };
  NodeArgs nodes[NODES];
  pthread_t threads[NODES];
  for (int i = 0; i < NODES; ++i) {
    nodes[i] = (NodeArgs){.store = &store, .node_id = i, .num_nodes = NODES, .num_devices = i + 1, .timeout_ms = 10000};
    pthread_create(&threads[i], NULL, create_node, &nodes[i]);
  }
  for (int i = 0; i < NODES; ++i) pthread_join(threads[i], NULL);
  for (int i = 0; i < NODES; ++i) {
    if (!ok(nodes[i].error, "multi-node Client_Create")) continue;
    PJRT_Client* client = nodes[i].client;
    size_t n = 0, na = 0;
    PJRT_Device* const* devices = all_devices(client, &n);
    PJRT_Device* const* local = addressable_devices(client, &na);
    CHECK(n == 6, "node %d sees 6 devices, got %zu", i, n);
    CHECK(na == (size_t)i + 1, "node %d addresses %d devices, got %zu", i, i + 1, na);
    int expected_process[6] = {0, 1, 1, 2, 2, 2};
    for (size_t k = 0; k < n && k < 6; ++k) {
      CHECK(device_id(devices[k]) == (int)k, "global id %zu", k);
      CHECK(device_process(devices[k]) == expected_process[k], "node %d device %zu process %d", i, k,
            device_process(devices[k]));
      PJRT_Device_IsAddressable_Args addr = {.struct_size = PJRT_Device_IsAddressable_Args_STRUCT_SIZE,
                                             .device = devices[k]};
      ok(api->PJRT_Device_IsAddressable(&addr), "IsAddressable");
      CHECK(addr.is_addressable == (expected_process[k] == i), "node %d device %zu addressable", i, k);
      if (!addr.is_addressable) {
        PJRT_Device_DefaultMemory_Args mem = {.struct_size = PJRT_Device_DefaultMemory_Args_STRUCT_SIZE,
                                              .device = devices[k]};
        expect_error(api->PJRT_Device_DefaultMemory(&mem), PJRT_Error_Code_INVALID_ARGUMENT, "not addressable",
                     "DefaultMemory of another process's device");
        float x = 1;
        PJRT_Buffer* b = NULL;
        expect_error(upload(client, devices[k], &x, PJRT_Buffer_Type_F32, NULL, 0, NULL, 0, &b),
                     PJRT_Error_Code_INVALID_ARGUMENT, "not addressable", "upload to another process's device");
      }
    }
    for (size_t k = 0; k < na; ++k) CHECK(device_process(local[k]) == i, "local device of node %d", i);
    PJRT_Client_ProcessIndex_Args pi = {.struct_size = PJRT_Client_ProcessIndex_Args_STRUCT_SIZE, .client = client};
    ok(api->PJRT_Client_ProcessIndex(&pi), "ProcessIndex");
    CHECK(pi.process_index == i, "process index %d", pi.process_index);
    destroy_client(client);
  }
  for (int i = 0; i < store.count; ++i) printf("     kv %s = %s\n", store.keys[i], store.values[i]);
  printf("ok   3 nodes exchanged devices through the KV store\n");

  /* A peer that never comes: a clear, bounded timeout. */
  FakeKvStore lonely = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
  NodeArgs alone = {.store = &lonely, .node_id = 0, .num_nodes = 2, .num_devices = 2, .timeout_ms = 200};
  create_node(&alone);
  CHECK(alone.client == NULL, "no client without the peer");
  expect_error(alone.error, PJRT_Error_Code_DEADLINE_EXCEEDED, "gave up waiting 200 ms for node 1", "missing peer");

  /* The store refuses the put: its error comes back with context. */
  FakeKvStore readonly = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .fail_puts = true};
  NodeArgs refused = {.store = &readonly, .node_id = 1, .num_nodes = 2, .num_devices = 1, .timeout_ms = 200};
  create_node(&refused);
  expect_error(refused.error, PJRT_Error_Code_PERMISSION_DENIED, "the store is read-only", "failing put");

  /* Another program wrote garbage under the peer's key. */
  FakeKvStore garbage = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .count = 1};
  snprintf(garbage.keys[0], 64, "stub_neuron/devices/1");
  snprintf(garbage.values[0], 64, "hello");
  NodeArgs confused = {.store = &garbage, .node_id = 0, .num_nodes = 2, .num_devices = 1, .timeout_ms = 200};
  create_node(&confused);
  expect_error(confused.error, PJRT_Error_Code_DATA_LOSS, "malformed device record", "malformed peer record");
}

/* ----------------------------- concurrent uploads ---------------------------- */

typedef struct {
  PJRT_Client* client;
  PJRT_Device* device;
  int seed;
  int errors;
} Worker;

static void* upload_many(void* p) {
  Worker* w = p;
  const int64_t dims[2] = {16, 16};
  for (int round = 0; round < 200; ++round) {
    int32_t data[256], out[256];
    for (int i = 0; i < 256; ++i) data[i] = w->seed * 100000 + round * 256 + i;
    PJRT_Buffer* b = NULL;
    PJRT_Client_BufferFromHostBuffer_Args args = {
        .struct_size = PJRT_Client_BufferFromHostBuffer_Args_STRUCT_SIZE, .client = w->client, .data = data,
        .type = PJRT_Buffer_Type_S32, .dims = dims, .num_dims = 2, .device = w->device};
    PJRT_Error* e = api->PJRT_Client_BufferFromHostBuffer(&args);
    if (e != NULL) {
      destroy_error(e);
      ++w->errors;
      continue;
    }
    b = args.buffer;
    PJRT_Event_Destroy_Args ed = {.struct_size = PJRT_Event_Destroy_Args_STRUCT_SIZE, .event = args.done_with_host_buffer};
    api->PJRT_Event_Destroy(&ed);
    PJRT_Buffer_ToHostBuffer_Args th = {.struct_size = PJRT_Buffer_ToHostBuffer_Args_STRUCT_SIZE, .src = b, .dst = out,
                                        .dst_size = sizeof out};
    e = api->PJRT_Buffer_ToHostBuffer(&th);
    if (e != NULL || memcmp(out, data, sizeof out) != 0) ++w->errors;
    if (e != NULL) destroy_error(e);
    ed.event = th.event;
    api->PJRT_Event_Destroy(&ed);
    PJRT_Buffer_Destroy_Args bd = {.struct_size = PJRT_Buffer_Destroy_Args_STRUCT_SIZE, .buffer = b};
    api->PJRT_Buffer_Destroy(&bd);
  }
  return NULL;
}

static void check_concurrent_uploads(void) {
  PJRT_Client* client = NULL;
  if (!ok(create_client(NULL, 0, &client), "Client_Create")) return;
  size_t n = 0;
  PJRT_Device* const* devices = addressable_devices(client, &n);
  enum { THREADS = 8 };
  Worker workers[THREADS];
  pthread_t threads[THREADS];
  for (int i = 0; i < THREADS; ++i) {
    workers[i] = (Worker){.client = client, .device = devices[i % n], .seed = i};
    pthread_create(&threads[i], NULL, upload_many, &workers[i]);
  }
  int errors = 0;
  for (int i = 0; i < THREADS; ++i) {
    pthread_join(threads[i], NULL);
    errors += workers[i].errors;
  }
  CHECK(errors == 0, "%d errors in concurrent uploads", errors);
  destroy_client(client);
  printf("ok   8 threads x 200 concurrent uploads\n");
}

int main(int argc, char** argv) {
#ifdef STUB_DRIVER_DLOPEN
  if (argc < 2) {
    fprintf(stderr, "usage: %s /path/to/libpjrt_stub_neuron.so\n", argv[0]);
    return 2;
  }
  void* handle = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (handle == NULL) {
    fprintf(stderr, "dlopen failed: %s\n", dlerror());
    return 2;
  }
  const PJRT_Api* (*get_api)(void) = (const PJRT_Api* (*)(void))dlsym(handle, "GetPjrtApi");
  live_objects = (int64_t(*)(void))dlsym(handle, "StubNeuron_LiveObjectCount");
  if (get_api == NULL || live_objects == NULL) {
    fprintf(stderr, "missing symbols: %s\n", dlerror());
    return 2;
  }
  api = get_api();
#else
  extern const PJRT_Api* GetPjrtApi(void);
  extern int64_t StubNeuron_LiveObjectCount(void);
  (void)argc;
  (void)argv;
  api = GetPjrtApi();
  live_objects = StubNeuron_LiveObjectCount;
#endif
  check_api_table();
  check_before_initialize();
  check_initialize_and_attributes();
  check_null_and_short_args();
  check_options();
  check_client_and_devices();
  check_topology();
  check_events();
  check_buffers();
  check_multi_node();
  check_concurrent_uploads();
  int64_t live = live_objects();
  CHECK(live == 0, "%lld objects still alive at the end", (long long)live);
  printf("%s: %d failure(s), %lld live objects\n", failures ? "FAILED" : "PASSED", failures, (long long)live);
  return failures ? 1 : 0;
}
