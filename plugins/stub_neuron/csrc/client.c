/* The stub_neuron client: create options, the multi-process device exchange
 * over the caller's KV store, devices, device descriptions and memories.
 *
 * A client is immutable once created, so every read here is thread-safe.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stub_neuron.h"

/* ----------------------------- create options ---------------------------- */

typedef struct {
  int64_t num_devices;   /* devices of this process */
  int64_t node_id;       /* this process's index, 0..num_nodes-1 */
  int64_t num_nodes;     /* processes sharing one KV store */
  int64_t kv_timeout_ms; /* how long to wait for each peer */
  bool node_id_set;
} StubOptions;

typedef struct {
  const char* name;
  size_t offset; /* of the int64_t field in StubOptions */
} OptionSpec;

static const OptionSpec option_specs[] = {
    {"num_devices", offsetof(StubOptions, num_devices)},
    {"node_id", offsetof(StubOptions, node_id)},
    {"num_nodes", offsetof(StubOptions, num_nodes)},
    {"kv_timeout_ms", offsetof(StubOptions, kv_timeout_ms)},
};
#define NUM_OPTION_SPECS (sizeof(option_specs) / sizeof(option_specs[0]))
#define KNOWN_OPTIONS "num_devices, node_id, num_nodes, kv_timeout_ms (all int64)"

static const char* named_value_type_name(PJRT_NamedValue_Type type) {
  switch (type) {
    case PJRT_NamedValue_kString: return "string";
    case PJRT_NamedValue_kInt64: return "int64";
    case PJRT_NamedValue_kInt64List: return "int64 list";
    case PJRT_NamedValue_kFloat: return "float";
    case PJRT_NamedValue_kBool: return "bool";
  }
  return "unknown type";
}

/* Reads the options, rejecting unknown names, wrong types and bad values. */
static PJRT_Error* parse_options(const PJRT_NamedValue* values, size_t count, StubOptions* out) {
  *out = (StubOptions){
      .num_devices = STUB_DEFAULT_NUM_DEVICES,
      .node_id = 0,
      .num_nodes = 1,
      .kv_timeout_ms = STUB_DEFAULT_KV_TIMEOUT_MS,
  };
  if (count > 0 && values == NULL) {
    return stub_error(PJRT_Error_Code_INVALID_ARGUMENT,
                      "PJRT_Client_Create: num_options is %zu but create_options is NULL", count);
  }
  bool seen[NUM_OPTION_SPECS] = {false};
  for (size_t i = 0; i < count; ++i) {
    const PJRT_NamedValue* value = &values[i];
    if (value->struct_size < PJRT_NamedValue_STRUCT_SIZE) {
      return stub_error(PJRT_Error_Code_INVALID_ARGUMENT,
                        "Unexpected PJRT_NamedValue size for create option %zu: expected at least %zu, got %zu",
                        i, (size_t)PJRT_NamedValue_STRUCT_SIZE, value->struct_size);
    }
    if (value->name == NULL || value->name_size == 0) {
      return stub_error(PJRT_Error_Code_INVALID_ARGUMENT, "create option %zu has no name", i);
    }
    int shown = value->name_size > 200 ? 200 : (int)value->name_size;
    size_t spec = 0;
    while (spec < NUM_OPTION_SPECS && !(strlen(option_specs[spec].name) == value->name_size &&
                                        memcmp(option_specs[spec].name, value->name, value->name_size) == 0)) {
      ++spec;
    }
    if (spec == NUM_OPTION_SPECS) {
      return stub_error(PJRT_Error_Code_INVALID_ARGUMENT,
                        "unknown create option '%.*s' for the stub_neuron plugin; it understands " KNOWN_OPTIONS,
                        shown, value->name);
    }
    if (seen[spec]) {
      return stub_error(PJRT_Error_Code_INVALID_ARGUMENT, "create option '%.*s' is given twice", shown,
                        value->name);
    }
    seen[spec] = true;
    if (value->type != PJRT_NamedValue_kInt64) {
      return stub_error(PJRT_Error_Code_INVALID_ARGUMENT, "create option '%.*s' must be an int64, got a %s",
                        shown, value->name, named_value_type_name(value->type));
    }
    *(int64_t*)((char*)out + option_specs[spec].offset) = value->int64_value;
    if (strcmp(option_specs[spec].name, "node_id") == 0) out->node_id_set = true;
  }

  if (out->num_devices < 1 || out->num_devices > STUB_MAX_LOCAL_DEVICES) {
    return stub_error(PJRT_Error_Code_INVALID_ARGUMENT, "create option num_devices=%lld is out of range 1..%d",
                      (long long)out->num_devices, STUB_MAX_LOCAL_DEVICES);
  }
  if (out->num_nodes < 1 || out->num_nodes > STUB_MAX_NODES) {
    return stub_error(PJRT_Error_Code_INVALID_ARGUMENT, "create option num_nodes=%lld is out of range 1..%d",
                      (long long)out->num_nodes, STUB_MAX_NODES);
  }
  if (out->num_nodes > 1 && !out->node_id_set) {
    return stub_error(PJRT_Error_Code_INVALID_ARGUMENT,
                      "create option node_id is required when num_nodes=%lld > 1", (long long)out->num_nodes);
  }
  if (out->node_id < 0 || out->node_id >= out->num_nodes) {
    return stub_error(PJRT_Error_Code_INVALID_ARGUMENT, "create option node_id=%lld is out of range 0..%lld",
                      (long long)out->node_id, (long long)out->num_nodes - 1);
  }
  if (out->kv_timeout_ms < 1 || out->kv_timeout_ms > INT_MAX) {
    return stub_error(PJRT_Error_Code_INVALID_ARGUMENT, "create option kv_timeout_ms=%lld is out of range 1..%d",
                      (long long)out->kv_timeout_ms, INT_MAX);
  }
  return NULL;
}

/* ------------------------- multi-process exchange ------------------------ */

/* What node <n> publishes under STUB_KV_KEY_PREFIX "<n>". */
#define RECORD_FORMAT "v1 num_devices=%lld"

/* Takes over an error returned by a KV callback and prefixes our context. */
static PJRT_Error* wrap_callback_error(PJRT_Error* inner, const char* what) {
  if (!stub_is_error(inner)) {
    return stub_error(PJRT_Error_Code_INTERNAL,
                      "%s: the KV callback returned an error that was not made with callback_error", what);
  }
  PJRT_Error* error = stub_error(inner->code, "%s: %s", what, inner->message);
  stub_error_free(inner);
  return error;
}

static PJRT_Error* publish_devices(const PJRT_Client_Create_Args* args, const StubOptions* options) {
  char key[64];
  char record[64];
  snprintf(key, sizeof(key), STUB_KV_KEY_PREFIX "%lld", (long long)options->node_id);
  snprintf(record, sizeof(record), RECORD_FORMAT, (long long)options->num_devices);
  PJRT_KeyValuePutCallback_Args put = {
      .struct_size = PJRT_KeyValuePutCallback_Args_STRUCT_SIZE,
      .key = key,
      .key_size = strlen(key),
      .value = record,
      .value_size = strlen(record),
      .callback_error = &stub_callback_error,
      .user_arg = args->kv_put_user_arg,
  };
  PJRT_Error* error = args->kv_put_callback(&put);
  if (error == NULL) return NULL;
  char what[160];
  snprintf(what, sizeof(what), "stub_neuron node %lld could not publish its devices under key '%s'",
           (long long)options->node_id, key);
  return wrap_callback_error(error, what);
}

/* Waits for node `peer`'s record and returns its device count in *num_devices. */
static PJRT_Error* read_peer_devices(const PJRT_Client_Create_Args* args, const StubOptions* options,
                                     int64_t peer, int64_t* num_devices) {
  char key[64];
  snprintf(key, sizeof(key), STUB_KV_KEY_PREFIX "%lld", (long long)peer);
  PJRT_KeyValueGetCallback_Args get = {
      .struct_size = PJRT_KeyValueGetCallback_Args_STRUCT_SIZE,
      .key = key,
      .key_size = strlen(key),
      .timeout_in_ms = (int)options->kv_timeout_ms,
      .callback_error = &stub_callback_error,
      .user_arg = args->kv_get_user_arg,
  };
  PJRT_Error* error = args->kv_get_callback(&get);

  /* Copy the value, then hand it back to its owner whatever happened. */
  char record[64] = {0};
  bool fits = get.value != NULL && get.value_size < sizeof(record);
  if (fits) memcpy(record, get.value, get.value_size);
  if (get.value != NULL && get.value_deleter_callback != NULL) get.value_deleter_callback(get.value);

  if (error != NULL) {
    char what[320];
    snprintf(what, sizeof(what),
             "stub_neuron node %lld gave up waiting %lld ms for node %lld to publish its devices under key "
             "'%s' (are all %lld processes running and sharing one KV store?)",
             (long long)options->node_id, (long long)options->kv_timeout_ms, (long long)peer, key,
             (long long)options->num_nodes);
    return wrap_callback_error(error, what);
  }
  long long count = 0;
  int consumed = 0;
  if (!fits || strlen(record) != get.value_size || sscanf(record, RECORD_FORMAT "%n", &count, &consumed) != 1 ||
      (size_t)consumed != get.value_size || count < 1 || count > STUB_MAX_LOCAL_DEVICES) {
    return stub_error(PJRT_Error_Code_DATA_LOSS,
                      "stub_neuron node %lld read a malformed device record for node %lld under key '%s' "
                      "(expected 'v1 num_devices=<1..%d>'; is another program using the same keys?)",
                      (long long)options->node_id, (long long)peer, key, STUB_MAX_LOCAL_DEVICES);
  }
  *num_devices = count;
  return NULL;
}

/* Fills counts[n] with the number of devices of every node. */
static PJRT_Error* exchange_devices(const PJRT_Client_Create_Args* args, const StubOptions* options,
                                    int64_t* counts) {
  counts[options->node_id] = options->num_devices;
  if (options->num_nodes == 1) return NULL;
  if (args->kv_put_callback == NULL || args->kv_get_callback == NULL) {
    return stub_error(PJRT_Error_Code_INVALID_ARGUMENT,
                      "stub_neuron: num_nodes=%lld needs the KV store callbacks (kv_put_callback and "
                      "kv_get_callback) to exchange devices; create the client through "
                      "pjrt_plugins.distributed or pass a kv_store",
                      (long long)options->num_nodes);
  }
  PJRT_Error* error = publish_devices(args, options);
  if (error != NULL) return error;
  int64_t total = 0;
  for (int64_t peer = 0; peer < options->num_nodes; ++peer) {
    if (peer != options->node_id) {
      error = read_peer_devices(args, options, peer, &counts[peer]);
      if (error != NULL) return error;
    }
    total += counts[peer];
  }
  if (total > STUB_MAX_GLOBAL_DEVICES) {
    return stub_error(PJRT_Error_Code_INVALID_ARGUMENT, "stub_neuron: %lld devices in all exceed the limit of %d",
                      (long long)total, STUB_MAX_GLOBAL_DEVICES);
  }
  return NULL;
}

/* --------------------------------- client -------------------------------- */

static void client_free(PJRT_Client* client) {
  if (client == NULL) return;
  client->magic = STUB_MAGIC_DEAD;
  stub_topology_free(&client->topology);
  free(client->devices);
  free(client->device_ptrs);
  free(client->addressable_ptrs);
  free(client->memories);
  free(client->memory_ptrs);
  stub_free(client);
}

void stub_client_release(PJRT_Client* client) {
  if (atomic_fetch_sub(&client->refs, 1) == 1) client_free(client);
}

static void describe_device(PJRT_Device* device, PJRT_Client* client, int id, int node, int local_index) {
  PJRT_DeviceDescription* d = &device->description;
  device->magic = STUB_MAGIC_DEVICE;
  device->client = client;
  device->addressable = node == client->node_id;
  d->magic = STUB_MAGIC_DESCRIPTION;
  d->id = id;
  d->process_index = node;
  d->local_index = local_index;
  static const char* names[STUB_NUM_DEVICE_ATTRIBUTES] = {"core_index", "node_id", "vendor"};
  for (int i = 0; i < STUB_NUM_DEVICE_ATTRIBUTES; ++i) {
    d->attributes[i].struct_size = PJRT_NamedValue_STRUCT_SIZE;
    d->attributes[i].name = names[i];
    d->attributes[i].name_size = strlen(names[i]);
    d->attributes[i].value_size = 1;
    d->attributes[i].type = PJRT_NamedValue_kInt64;
  }
  d->attributes[0].int64_value = local_index;
  d->attributes[1].int64_value = node;
  d->attributes[2].type = PJRT_NamedValue_kString;
  d->attributes[2].string_value = "stub";
  d->attributes[2].value_size = 4;
  snprintf(d->debug_string, sizeof(d->debug_string),
           "StubNeuronDevice(id=%d, process_index=%d, core_index=%d, kind=\"" STUB_DEVICE_KIND "\")", id, node,
           local_index);
  snprintf(d->to_string, sizeof(d->to_string), "NeuronDevice(id=%d)", id);
}

static PJRT_Error* build_client(const StubOptions* options, const int64_t* counts, PJRT_Client** out) {
  size_t total = 0;
  for (int64_t n = 0; n < options->num_nodes; ++n) total += (size_t)counts[n];
  size_t local = (size_t)options->num_devices;

  PJRT_Client* client = stub_alloc(sizeof(PJRT_Client));
  if (client == NULL) return stub_error(PJRT_Error_Code_RESOURCE_EXHAUSTED, "stub_neuron: out of memory");
  client->magic = STUB_MAGIC_CLIENT;
  atomic_init(&client->refs, 1);
  atomic_init(&client->destroyed, false);
  client->node_id = (int)options->node_id;
  client->num_nodes = (int)options->num_nodes;
  client->num_devices = total;
  client->num_addressable = local;
  client->devices = calloc(total, sizeof(PJRT_Device));
  client->device_ptrs = calloc(total, sizeof(PJRT_Device*));
  client->addressable_ptrs = calloc(local, sizeof(PJRT_Device*));
  client->memories = calloc(local, sizeof(PJRT_Memory));
  client->memory_ptrs = calloc(local, sizeof(PJRT_Memory*));
  if (!client->devices || !client->device_ptrs || !client->addressable_ptrs || !client->memories ||
      !client->memory_ptrs) {
    client_free(client);
    return stub_error(PJRT_Error_Code_RESOURCE_EXHAUSTED, "stub_neuron: out of memory for %zu devices", total);
  }
  snprintf(client->platform_version, sizeof(client->platform_version),
           "stub_neuron %s (PJRT C API %d.%d, node %d of %d)", STUB_NEURON_VERSION, PJRT_API_MAJOR, PJRT_API_MINOR,
           client->node_id, client->num_nodes);

  /* Global ids run node by node: node 0's devices first, then node 1's, ... */
  size_t id = 0;
  size_t next_local = 0;
  for (int64_t node = 0; node < options->num_nodes; ++node) {
    for (int64_t k = 0; k < counts[node]; ++k, ++id) {
      PJRT_Device* device = &client->devices[id];
      client->device_ptrs[id] = device;
      describe_device(device, client, (int)id, (int)node, (int)k);
      if (!device->addressable) continue;
      PJRT_Memory* memory = &client->memories[next_local];
      memory->magic = STUB_MAGIC_MEMORY;
      memory->id = (int)id;
      memory->device = device;
      snprintf(memory->debug_string, sizeof(memory->debug_string),
               "StubNeuronMemory(id=%d, kind=\"" STUB_MEMORY_KIND "\", device=%d)", (int)id, (int)id);
      snprintf(memory->to_string, sizeof(memory->to_string), "NeuronMemory(id=%d)", (int)id);
      device->memory = memory;
      client->memory_ptrs[next_local] = memory;
      client->addressable_ptrs[next_local] = device;
      ++next_local;
    }
  }
  PJRT_Error* error = stub_topology_init(client);
  if (error != NULL) {
    client_free(client);
    return error;
  }
  *out = client;
  return NULL;
}

PJRT_Error* StubClient_Create(PJRT_Client_Create_Args* args) {
  /* kv_try_get_* came later and are not used: accept callers that predate them. */
  STUB_CHECK_ARGS_SIZE(args, PJRT_Client_Create_Args, PJRT_STRUCT_SIZE(PJRT_Client_Create_Args, client));
  args->client = NULL;
  if (!stub_is_initialized()) {
    return stub_error(PJRT_Error_Code_FAILED_PRECONDITION,
                      "PJRT_Plugin_Initialize must be called before PJRT_Client_Create");
  }
  StubOptions options;
  PJRT_Error* error = parse_options(args->create_options, args->num_options, &options);
  if (error != NULL) return error;

  int64_t* counts = calloc((size_t)options.num_nodes, sizeof(int64_t));
  if (counts == NULL) return stub_error(PJRT_Error_Code_RESOURCE_EXHAUSTED, "stub_neuron: out of memory");
  error = exchange_devices(args, &options, counts);
  if (error == NULL) error = build_client(&options, counts, &args->client);
  free(counts);
  return error;
}

PJRT_Error* stub_check_client(const PJRT_Client* client, const char* function) {
  PJRT_Error* error = stub_check_object(client, STUB_MAGIC_CLIENT, "client", function);
  if (error != NULL) return error;
  if (atomic_load(&client->destroyed)) {
    return stub_error(PJRT_Error_Code_FAILED_PRECONDITION, "%s: the client has been destroyed", function);
  }
  return NULL;
}

PJRT_Error* StubClient_Destroy(PJRT_Client_Destroy_Args* args) {
  STUB_CHECK_ARGS(args, PJRT_Client_Destroy_Args);
  if (args->client == NULL) return NULL;
  if (args->client->magic != STUB_MAGIC_CLIENT) {
    return stub_error(PJRT_Error_Code_INVALID_ARGUMENT,
                      "PJRT_Client_Destroy: not a stub_neuron client (a wrong or destroyed pointer)");
  }
  if (atomic_exchange(&args->client->destroyed, true)) {
    return stub_error(PJRT_Error_Code_FAILED_PRECONDITION, "PJRT_Client_Destroy: the client was already destroyed");
  }
  /* Buffers still alive keep the client's memory until they are destroyed. */
  stub_client_release(args->client);
  return NULL;
}

PJRT_Error* StubClient_PlatformName(PJRT_Client_PlatformName_Args* args) {
  STUB_CHECK_ARGS(args, PJRT_Client_PlatformName_Args);
  PJRT_Error* error = stub_check_client(args->client, "PJRT_Client_PlatformName");
  if (error != NULL) return error;
  args->platform_name = STUB_PLATFORM_NAME;
  args->platform_name_size = sizeof(STUB_PLATFORM_NAME) - 1;
  return NULL;
}

PJRT_Error* StubClient_ProcessIndex(PJRT_Client_ProcessIndex_Args* args) {
  STUB_CHECK_ARGS(args, PJRT_Client_ProcessIndex_Args);
  PJRT_Error* error = stub_check_client(args->client, "PJRT_Client_ProcessIndex");
  if (error != NULL) return error;
  args->process_index = args->client->node_id;
  return NULL;
}

PJRT_Error* StubClient_PlatformVersion(PJRT_Client_PlatformVersion_Args* args) {
  STUB_CHECK_ARGS(args, PJRT_Client_PlatformVersion_Args);
  PJRT_Error* error = stub_check_client(args->client, "PJRT_Client_PlatformVersion");
  if (error != NULL) return error;
  args->platform_version = args->client->platform_version;
  args->platform_version_size = strlen(args->client->platform_version);
  return NULL;
}

PJRT_Error* StubClient_Devices(PJRT_Client_Devices_Args* args) {
  STUB_CHECK_ARGS(args, PJRT_Client_Devices_Args);
  PJRT_Error* error = stub_check_client(args->client, "PJRT_Client_Devices");
  if (error != NULL) return error;
  args->devices = args->client->device_ptrs;
  args->num_devices = args->client->num_devices;
  return NULL;
}

PJRT_Error* StubClient_AddressableDevices(PJRT_Client_AddressableDevices_Args* args) {
  STUB_CHECK_ARGS(args, PJRT_Client_AddressableDevices_Args);
  PJRT_Error* error = stub_check_client(args->client, "PJRT_Client_AddressableDevices");
  if (error != NULL) return error;
  args->addressable_devices = args->client->addressable_ptrs;
  args->num_addressable_devices = args->client->num_addressable;
  return NULL;
}

PJRT_Error* StubClient_LookupDevice(PJRT_Client_LookupDevice_Args* args) {
  STUB_CHECK_ARGS(args, PJRT_Client_LookupDevice_Args);
  PJRT_Error* error = stub_check_client(args->client, "PJRT_Client_LookupDevice");
  if (error != NULL) return error;
  if (args->id < 0 || (size_t)args->id >= args->client->num_devices) {
    return stub_error(PJRT_Error_Code_NOT_FOUND, "no stub_neuron device has id %d (ids are 0..%zu)", args->id,
                      args->client->num_devices - 1);
  }
  args->device = args->client->device_ptrs[args->id];
  return NULL;
}

PJRT_Error* StubClient_LookupAddressableDevice(PJRT_Client_LookupAddressableDevice_Args* args) {
  STUB_CHECK_ARGS(args, PJRT_Client_LookupAddressableDevice_Args);
  PJRT_Error* error = stub_check_client(args->client, "PJRT_Client_LookupAddressableDevice");
  if (error != NULL) return error;
  if (args->local_hardware_id < 0 || (size_t)args->local_hardware_id >= args->client->num_addressable) {
    return stub_error(PJRT_Error_Code_NOT_FOUND,
                      "no addressable stub_neuron device has local hardware id %d (ids are 0..%zu)",
                      args->local_hardware_id, args->client->num_addressable - 1);
  }
  args->addressable_device = args->client->addressable_ptrs[args->local_hardware_id];
  return NULL;
}

PJRT_Error* StubClient_AddressableMemories(PJRT_Client_AddressableMemories_Args* args) {
  STUB_CHECK_ARGS(args, PJRT_Client_AddressableMemories_Args);
  PJRT_Error* error = stub_check_client(args->client, "PJRT_Client_AddressableMemories");
  if (error != NULL) return error;
  args->addressable_memories = args->client->memory_ptrs;
  args->num_addressable_memories = args->client->num_addressable;
  return NULL;
}

PJRT_Error* StubClient_Compile(PJRT_Client_Compile_Args* args) {
  STUB_CHECK_ARGS(args, PJRT_Client_Compile_Args);
  PJRT_Error* error = stub_check_client(args->client, "PJRT_Client_Compile");
  if (error != NULL) return error;
  args->executable = NULL;
  return stub_error(PJRT_Error_Code_UNIMPLEMENTED,
                    "the stub_neuron plugin has no compiler, so it cannot compile or run programs; "
                    "set NEURON_LIBRARY_PATH to a real Neuron PJRT library to compile");
}

/* --------------------------- device descriptions ------------------------- */

#define STUB_CHECK_DESCRIPTION(args, sname) \
  STUB_CHECK_ARGS_OBJECT(args, sname, device_description, STUB_MAGIC_DESCRIPTION, "device description")

PJRT_Error* StubDeviceDescription_Id(PJRT_DeviceDescription_Id_Args* args) {
  STUB_CHECK_DESCRIPTION(args, PJRT_DeviceDescription_Id);
  args->id = args->device_description->id;
  return NULL;
}

PJRT_Error* StubDeviceDescription_ProcessIndex(PJRT_DeviceDescription_ProcessIndex_Args* args) {
  STUB_CHECK_DESCRIPTION(args, PJRT_DeviceDescription_ProcessIndex);
  args->process_index = args->device_description->process_index;
  return NULL;
}

PJRT_Error* StubDeviceDescription_Attributes(PJRT_DeviceDescription_Attributes_Args* args) {
  STUB_CHECK_DESCRIPTION(args, PJRT_DeviceDescription_Attributes);
  args->attributes = args->device_description->attributes;
  args->num_attributes = STUB_NUM_DEVICE_ATTRIBUTES;
  return NULL;
}

PJRT_Error* StubDeviceDescription_Kind(PJRT_DeviceDescription_Kind_Args* args) {
  STUB_CHECK_DESCRIPTION(args, PJRT_DeviceDescription_Kind);
  args->device_kind = STUB_DEVICE_KIND;
  args->device_kind_size = sizeof(STUB_DEVICE_KIND) - 1;
  return NULL;
}

PJRT_Error* StubDeviceDescription_DebugString(PJRT_DeviceDescription_DebugString_Args* args) {
  STUB_CHECK_DESCRIPTION(args, PJRT_DeviceDescription_DebugString);
  args->debug_string = args->device_description->debug_string;
  args->debug_string_size = strlen(args->device_description->debug_string);
  return NULL;
}

PJRT_Error* StubDeviceDescription_ToString(PJRT_DeviceDescription_ToString_Args* args) {
  STUB_CHECK_DESCRIPTION(args, PJRT_DeviceDescription_ToString);
  args->to_string = args->device_description->to_string;
  args->to_string_size = strlen(args->device_description->to_string);
  return NULL;
}

/* --------------------------------- devices ------------------------------- */

#define STUB_CHECK_DEVICE(args, sname) STUB_CHECK_ARGS_OBJECT(args, sname, device, STUB_MAGIC_DEVICE, "device")

PJRT_Error* StubDevice_GetDescription(PJRT_Device_GetDescription_Args* args) {
  STUB_CHECK_DEVICE(args, PJRT_Device_GetDescription);
  args->device_description = &args->device->description;
  return NULL;
}

PJRT_Error* StubDevice_IsAddressable(PJRT_Device_IsAddressable_Args* args) {
  STUB_CHECK_DEVICE(args, PJRT_Device_IsAddressable);
  args->is_addressable = args->device->addressable;
  return NULL;
}

PJRT_Error* StubDevice_LocalHardwareId(PJRT_Device_LocalHardwareId_Args* args) {
  STUB_CHECK_DEVICE(args, PJRT_Device_LocalHardwareId);
  /* The core index on the device's own node (what NEURON_RT_VISIBLE_CORES renumbers). */
  args->local_hardware_id = args->device->description.local_index;
  return NULL;
}

PJRT_Error* StubDevice_AddressableMemories(PJRT_Device_AddressableMemories_Args* args) {
  STUB_CHECK_DEVICE(args, PJRT_Device_AddressableMemories);
  PJRT_Device* device = args->device;
  args->memories = device->memory != NULL ? &device->memory : NULL;
  args->num_memories = device->memory != NULL ? 1 : 0;
  return NULL;
}

PJRT_Error* StubDevice_DefaultMemory(PJRT_Device_DefaultMemory_Args* args) {
  STUB_CHECK_DEVICE(args, PJRT_Device_DefaultMemory);
  if (args->device->memory == NULL) {
    return stub_error(PJRT_Error_Code_INVALID_ARGUMENT,
                      "PJRT_Device_DefaultMemory: device %d belongs to process %d and is not addressable from "
                      "this process, so it has no memory here",
                      args->device->description.id, args->device->description.process_index);
  }
  args->memory = args->device->memory;
  return NULL;
}

/* --------------------------------- memories ------------------------------ */

#define STUB_CHECK_MEMORY(args, sname) STUB_CHECK_ARGS_OBJECT(args, sname, memory, STUB_MAGIC_MEMORY, "memory")

PJRT_Error* StubMemory_Id(PJRT_Memory_Id_Args* args) {
  STUB_CHECK_MEMORY(args, PJRT_Memory_Id);
  args->id = args->memory->id;
  return NULL;
}

PJRT_Error* StubMemory_Kind(PJRT_Memory_Kind_Args* args) {
  STUB_CHECK_MEMORY(args, PJRT_Memory_Kind);
  args->kind = STUB_MEMORY_KIND;
  args->kind_size = sizeof(STUB_MEMORY_KIND) - 1;
  return NULL;
}

PJRT_Error* StubMemory_DebugString(PJRT_Memory_DebugString_Args* args) {
  STUB_CHECK_MEMORY(args, PJRT_Memory_DebugString);
  args->debug_string = args->memory->debug_string;
  args->debug_string_size = strlen(args->memory->debug_string);
  return NULL;
}

PJRT_Error* StubMemory_ToString(PJRT_Memory_ToString_Args* args) {
  STUB_CHECK_MEMORY(args, PJRT_Memory_ToString);
  args->to_string = args->memory->to_string;
  args->to_string_size = strlen(args->memory->to_string);
  return NULL;
}

PJRT_Error* StubMemory_AddressableByDevices(PJRT_Memory_AddressableByDevices_Args* args) {
  STUB_CHECK_MEMORY(args, PJRT_Memory_AddressableByDevices);
  args->devices = &args->memory->device;
  args->num_devices = 1;
  return NULL;
}
