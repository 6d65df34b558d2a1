/* A PJRT plugin for tests: it forwards to a real plugin and misbehaves on request.
 *
 * Built by tests/runtime/conftest.py with gcc against the pjrt_c_api.h that the CPU plugin
 * wheel installs. Each -D switch selects one misbehaviour, so the runtime's loader, slot
 * gating, initialize timeout, extension walk and KV-store callbacks meet a real C library:
 *
 *   SHIM_TARGET="path"     the real plugin to forward to (required)
 *   SHIM_MAJOR / SHIM_MINOR   report this API version instead of the real one
 *   SHIM_SLOTS=n           shrink PJRT_Api.struct_size to n function slots
 *   SHIM_NULL_SLOT=name    leave that function NULL
 *   SHIM_NULL_API          GetPjrtApi returns NULL
 *   SHIM_INIT_SLEEP_MS=n   PJRT_Plugin_Initialize sleeps n ms first
 *   SHIM_EXT_CYCLE         an extension chain A -> B -> A
 *   SHIM_EXT_BAD_SIZE      an extension whose struct_size is too small
 *   SHIM_KV                PJRT_Client_Create exercises the KV-store callbacks first and
 *                          records what happened in shim_report()
 *   SHIM_NOT_ON_CPU        PJRT_Buffer_IsOnCpu answers false (buffers look like device memory)
 *   SHIM_FAIL_BUFFER_DESTROY  PJRT_Buffer_Destroy frees the buffer, then returns an error
 *   SHIM_FAIL_EVENT_IS_READY  PJRT_Event_IsReady returns an error
 *   SHIM_FAIL_EXECUTION    awaiting an execution's device-complete event returns an error (a
 *                          program that fails on its device; the real one ran)
 *   SHIM_FAIL_EVENT_DESTROY   destroying a device-complete event destroys it, notes
 *                          "completion_destroy;", then returns an error
 *   SHIM_FAIL_DATA_POINTER PJRT_Buffer_OpaqueDeviceMemoryDataPointer returns an error (each
 *                          external reference taken and dropped is noted: "hold;" "unhold;")
 *   SHIM_STUCK_EXECUTE     an execution's device-complete events never become ready (the real
 *                          execution runs; its events are swapped for ones that never fire),
 *                          as when devices deadlock inside a plugin
 *   SHIM_RECORD_LAUNCH_IDS each Execute notes "launch=<PJRT_ExecuteOptions.launch_id>;"
 *   (with either, shim_report() counts buffer_destroy; executable_destroy; client_destroy;)
 *   SHIM_CHECK_LIFETIMES   remember every client, buffer and loaded executable destroyed (until the
 *                          plugin hands out the same address again); a call on one aborts the
 *                          process naming the function: a use after free made visible
 *                          BufferFromHostBuffer, ToHostBuffer, Execute and Compile first count themselves
 *                          (shim_calls_entered()) and sleep shim_set_sleep_ms(n) ms (0 at start),
 *                          then check their handles: a test closes or deletes on another thread
 *                          meanwhile
 *   SHIM_NULL_CLIENT       PJRT_Client_Create reports success but hands back no client (NULL)
 *   SHIM_GET_API_SLEEP_MS=n   GetPjrtApi sleeps n ms first (a load that hangs)
 *   SHIM_CREATE_SLEEP_MS=n    PJRT_Client_Create sleeps n ms first (a client creation that hangs)
 *   SHIM_OVERSTATE_TABLE   PJRT_Api.struct_size claims 64 more slots than the table has; they hold
 *                          pointers to data (what a real overstated table reads past its end)
 *   SHIM_MEMORY_STATS      PJRT_Device_MemoryStats answers fixed numbers (as a GPU plugin's allocator
 *                          would): bytes_in_use 1000 + the device's id, peak 5000, bytes_limit 1<<30,
 *                          num_allocs 7; every other statistic unset
 *   SHIM_MEMORY_DESCRIPTIONS  a MemoryDescriptions extension: every device supports "device"
 *                          (kind id 0, the default) and "pinned_host" (kind id 1)
 *   SHIM_PROFILER          a Profiler extension whose profiler records each
 *                          PJRT_LoadedExecutable_Execute call made between start and stop (its
 *                          wall time) and collects them as an XSpace: plane "/device:SHIM:0",
 *                          line "Execute", events "shim_execute"; with SHIM_PROFILER_FAIL_START its
 *                          start fails with UNAVAILABLE "shim profiler: no tracer here"
 * A plugin that lies: each reports success with an answer that cannot be used.
 *   SHIM_NULL_DATA_POINTER PJRT_Buffer_OpaqueDeviceMemoryDataPointer gives NULL as the address
 *   SHIM_NULL_OUTPUT       Execute leaves output 0 of its last device NULL (the real one destroyed)
 *   SHIM_NULL_EXECUTABLE   Compile gives no executable (the real one destroyed)
 *   SHIM_NULL_READY_EVENT  PJRT_Buffer_ReadyEvent gives no event (the real one destroyed)
 *   SHIM_LYING_LISTS       Client_Devices gives its devices at NULL, AddressableDevices a count of
 *                          (size_t)-1, LookupDevice a NULL device, Device_AddressableMemories a
 *                          list holding NULL
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pjrt_c_api.h"

/* The table and what follows it in memory (filled only with SHIM_OVERSTATE_TABLE). */
static struct {
  PJRT_Api api;
  const void* tail[64];
} shim_table;
#define shim_api shim_table.api
static const PJRT_Api* real_api;
static char report[8192];

const char* shim_report(void) { return report; }

static pthread_mutex_t report_lock = PTHREAD_MUTEX_INITIALIZER;  /* executes run on several threads */

static void note(const char* fmt, const char* a, size_t n) {
  pthread_mutex_lock(&report_lock);
  size_t used = strlen(report);
  if (used + n + 64 < sizeof(report)) snprintf(report + used, sizeof(report) - used, fmt, (int)n, a);
  pthread_mutex_unlock(&report_lock);
}

static inline void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

#ifdef SHIM_INIT_SLEEP_MS
static PJRT_Error* shim_initialize(PJRT_Plugin_Initialize_Args* args) {
  sleep_ms(SHIM_INIT_SLEEP_MS);
  return real_api->PJRT_Plugin_Initialize(args);
}
#endif

#ifdef SHIM_NOT_ON_CPU
static PJRT_Error* shim_is_on_cpu(PJRT_Buffer_IsOnCpu_Args* args) {
  PJRT_Error* error = real_api->PJRT_Buffer_IsOnCpu(args);
  args->is_on_cpu = false;
  return error;
}
#endif

#if defined(SHIM_FAIL_EXECUTION) || defined(SHIM_FAIL_EVENT_DESTROY) || defined(SHIM_FAIL_DATA_POINTER)
#define SHIM_MAKES_ERRORS
#endif
#if defined(SHIM_FAIL_BUFFER_DESTROY) || defined(SHIM_FAIL_EVENT_IS_READY) || defined(SHIM_MAKES_ERRORS)
/* A real PJRT_Error from the real plugin: look up a device id that does not exist. */
static PJRT_Client* last_client;
static PJRT_Error* shim_error(void) {
  PJRT_Client_LookupDevice_Args args;
  memset(&args, 0, sizeof(args));
  args.struct_size = PJRT_Client_LookupDevice_Args_STRUCT_SIZE;
  args.client = last_client;
  args.id = -12345;
  return real_api->PJRT_Client_LookupDevice(&args);
}
static PJRT_Error* shim_create_recording(PJRT_Client_Create_Args* args) {
  report[0] = '\0';
  PJRT_Error* error = real_api->PJRT_Client_Create(args);
  if (error == NULL) last_client = args->client;
  return error;
}
static PJRT_Error* shim_client_destroy(PJRT_Client_Destroy_Args* args) {
  note("%.*s", "client_destroy;", 15);
  return real_api->PJRT_Client_Destroy(args);
}
static PJRT_Error* shim_executable_destroy(PJRT_LoadedExecutable_Destroy_Args* args) {
  note("%.*s", "executable_destroy;", 19);
  return real_api->PJRT_LoadedExecutable_Destroy(args);
}
static PJRT_Error* shim_buffer_destroy(PJRT_Buffer_Destroy_Args* args) {
  note("%.*s", "buffer_destroy;", 15);
  PJRT_Error* error = real_api->PJRT_Buffer_Destroy(args);
#ifdef SHIM_FAIL_BUFFER_DESTROY
  if (error == NULL && args->buffer != NULL) error = shim_error();
#endif
  return error;
}
#endif
#ifdef SHIM_FAIL_EVENT_IS_READY
static PJRT_Error* shim_event_is_ready(PJRT_Event_IsReady_Args* args) {
  (void)args;
  return shim_error();
}
#endif

#if defined(SHIM_FAIL_EXECUTION) || defined(SHIM_FAIL_EVENT_DESTROY)
/* The device-complete events handed out by the last Execute (told apart from other events). */
static PJRT_Event* completions[64];
static int is_completion(PJRT_Event* event) {
  for (size_t i = 0; i < sizeof(completions) / sizeof(completions[0]); ++i)
    if (event != NULL && completions[i] == event) return 1;
  return 0;
}
static PJRT_Error* shim_recording_execute(PJRT_LoadedExecutable_Execute_Args* args) {
  PJRT_Error* error = real_api->PJRT_LoadedExecutable_Execute(args);
  memset(completions, 0, sizeof(completions));
  if (error == NULL && args->device_complete_events != NULL)
    for (size_t d = 0; d < args->num_devices && d < sizeof(completions) / sizeof(completions[0]); ++d)
      completions[d] = args->device_complete_events[d];
  return error;
}
static PJRT_Error* shim_completion_await(PJRT_Event_Await_Args* args) {
  PJRT_Error* error = real_api->PJRT_Event_Await(args);
#ifdef SHIM_FAIL_EXECUTION
  if (error == NULL && is_completion(args->event)) error = shim_error();
#endif
  return error;
}
static PJRT_Error* shim_completion_destroy(PJRT_Event_Destroy_Args* args) {
  int completion = is_completion(args->event);
  PJRT_Error* error = real_api->PJRT_Event_Destroy(args);
#ifdef SHIM_FAIL_EVENT_DESTROY
  if (completion) note("%.*s", "completion_destroy;", 19);
  if (error == NULL && completion) error = shim_error();
#else
  (void)completion;
#endif
  return error;
}
#endif

#ifdef SHIM_FAIL_DATA_POINTER
static PJRT_Error* shim_hold(PJRT_Buffer_IncreaseExternalReferenceCount_Args* args) {
  note("%.*s", "hold;", 5);
  return real_api->PJRT_Buffer_IncreaseExternalReferenceCount(args);
}
static PJRT_Error* shim_unhold(PJRT_Buffer_DecreaseExternalReferenceCount_Args* args) {
  note("%.*s", "unhold;", 7);
  return real_api->PJRT_Buffer_DecreaseExternalReferenceCount(args);
}
static PJRT_Error* shim_data_pointer(PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args* args) {
  (void)args;
  return shim_error();
}
#endif

#ifdef SHIM_CHECK_LIFETIMES
#include <pthread.h>
#define MAX_DEAD 4096
static const void* dead[MAX_DEAD];
static int num_dead;
static int calls_entered, call_sleep_ms;
static pthread_mutex_t dead_lock = PTHREAD_MUTEX_INITIALIZER;

int shim_calls_entered(void) { return __atomic_load_n(&calls_entered, __ATOMIC_SEQ_CST); }
void shim_set_sleep_ms(int ms) { __atomic_store_n(&call_sleep_ms, ms, __ATOMIC_SEQ_CST); }

static void bury(const void* handle) {
  pthread_mutex_lock(&dead_lock);
  if (num_dead < MAX_DEAD) dead[num_dead++] = handle;
  pthread_mutex_unlock(&dead_lock);
}

static void revive(const void* handle) { /* the plugin reused a freed address for a new handle */
  pthread_mutex_lock(&dead_lock);
  for (int i = 0; i < num_dead; i++) {
    if (dead[i] == handle) dead[i--] = dead[--num_dead];
  }
  pthread_mutex_unlock(&dead_lock);
}

static void check_alive(const char* function, const void* handle) {
  pthread_mutex_lock(&dead_lock);
  int found = 0;
  for (int i = 0; i < num_dead && !found; i++) found = dead[i] == handle;
  pthread_mutex_unlock(&dead_lock);
  if (found) {
    fprintf(stderr, "shim: %s called on destroyed handle %p (use after free)\n", function, handle);
    fflush(stderr);
    abort();
  }
}

static void enter_slowly(void) {
  int ms = __atomic_load_n(&call_sleep_ms, __ATOMIC_SEQ_CST);
  __atomic_add_fetch(&calls_entered, 1, __ATOMIC_SEQ_CST);
  if (ms > 0) sleep_ms(ms);
}

static size_t count_outputs(PJRT_LoadedExecutable* loaded) {
  PJRT_LoadedExecutable_GetExecutable_Args get;
  memset(&get, 0, sizeof(get));
  get.struct_size = PJRT_LoadedExecutable_GetExecutable_Args_STRUCT_SIZE;
  get.loaded_executable = loaded;
  if (real_api->PJRT_LoadedExecutable_GetExecutable(&get)) return 0;
  PJRT_Executable_NumOutputs_Args num;
  memset(&num, 0, sizeof(num));
  num.struct_size = PJRT_Executable_NumOutputs_Args_STRUCT_SIZE;
  num.executable = get.executable;
  size_t outputs = real_api->PJRT_Executable_NumOutputs(&num) ? 0 : num.num_outputs;
  PJRT_Executable_Destroy_Args destroy;
  memset(&destroy, 0, sizeof(destroy));
  destroy.struct_size = PJRT_Executable_Destroy_Args_STRUCT_SIZE;
  destroy.executable = get.executable;
  real_api->PJRT_Executable_Destroy(&destroy);
  return outputs;
}

static PJRT_Error* lt_client_create(PJRT_Client_Create_Args* args) {
  PJRT_Error* error = real_api->PJRT_Client_Create(args);
  if (!error) revive(args->client);
  return error;
}
static PJRT_Error* lt_client_destroy(PJRT_Client_Destroy_Args* args) {
  check_alive("PJRT_Client_Destroy", args->client);
  PJRT_Error* error = real_api->PJRT_Client_Destroy(args);
  bury(args->client);
  return error;
}
static PJRT_Error* lt_compile(PJRT_Client_Compile_Args* args) {
  enter_slowly();
  check_alive("PJRT_Client_Compile", args->client);
  PJRT_Error* error = real_api->PJRT_Client_Compile(args);
  if (!error) revive(args->executable);
  return error;
}
static PJRT_Error* lt_from_host(PJRT_Client_BufferFromHostBuffer_Args* args) {
  enter_slowly();
  check_alive("PJRT_Client_BufferFromHostBuffer", args->client);
  PJRT_Error* error = real_api->PJRT_Client_BufferFromHostBuffer(args);
  if (!error) revive(args->buffer);
  return error;
}
static PJRT_Error* lt_to_host(PJRT_Buffer_ToHostBuffer_Args* args) {
  enter_slowly();
  check_alive("PJRT_Buffer_ToHostBuffer", args->src);
  return real_api->PJRT_Buffer_ToHostBuffer(args);
}
static PJRT_Error* lt_execute(PJRT_LoadedExecutable_Execute_Args* args) {
  enter_slowly();
  check_alive("PJRT_LoadedExecutable_Execute", args->executable);
  for (size_t d = 0; d < args->num_devices; d++)
    for (size_t i = 0; i < args->num_args; i++) check_alive("PJRT_LoadedExecutable_Execute", args->argument_lists[d][i]);
  size_t outputs = count_outputs(args->executable);
  PJRT_Error* error = real_api->PJRT_LoadedExecutable_Execute(args);
  if (!error)
    for (size_t d = 0; d < args->num_devices; d++)
      for (size_t i = 0; i < outputs; i++) revive(args->output_lists[d][i]);
  return error;
}
static PJRT_Error* lt_buffer_destroy(PJRT_Buffer_Destroy_Args* args) {
  check_alive("PJRT_Buffer_Destroy", args->buffer);
  PJRT_Error* error = real_api->PJRT_Buffer_Destroy(args);
  bury(args->buffer);
  return error;
}
static PJRT_Error* lt_executable_destroy(PJRT_LoadedExecutable_Destroy_Args* args) {
  check_alive("PJRT_LoadedExecutable_Destroy", args->executable);
  PJRT_Error* error = real_api->PJRT_LoadedExecutable_Destroy(args);
  bury(args->executable);
  return error;
}
#endif

#ifdef SHIM_STUCK_EXECUTE
/* Events that never fire: addresses inside this array, told apart from the real plugin's. */
static char stuck_events[256];
static int is_stuck(PJRT_Event* event) {
  return (char*)event >= stuck_events && (char*)event < stuck_events + sizeof(stuck_events);
}
static PJRT_Error* shim_stuck_execute(PJRT_LoadedExecutable_Execute_Args* args) {
  PJRT_Error* error = real_api->PJRT_LoadedExecutable_Execute(args);
  if (error != NULL || args->device_complete_events == NULL) return error;
  for (size_t d = 0; d < args->num_devices && d < sizeof(stuck_events); ++d) {
    PJRT_Event_Destroy_Args destroy;
    memset(&destroy, 0, sizeof(destroy));
    destroy.struct_size = PJRT_Event_Destroy_Args_STRUCT_SIZE;
    destroy.event = args->device_complete_events[d];
    real_api->PJRT_Event_Destroy(&destroy);
    args->device_complete_events[d] = (PJRT_Event*)&stuck_events[d];
  }
  return NULL;
}
static PJRT_Error* shim_event_is_ready_stuck(PJRT_Event_IsReady_Args* args) {
  if (!is_stuck(args->event)) return real_api->PJRT_Event_IsReady(args);
  args->is_ready = false;
  return NULL;
}
static PJRT_Error* shim_event_on_ready(PJRT_Event_OnReady_Args* args) {
  if (!is_stuck(args->event)) return real_api->PJRT_Event_OnReady(args);
  note("%.*s", "on_ready;", 9);
  return NULL; /* never called back */
}
static PJRT_Error* shim_event_await(PJRT_Event_Await_Args* args) {
  if (!is_stuck(args->event)) return real_api->PJRT_Event_Await(args);
  for (;;) {
    struct timespec ts = {3600, 0};
    nanosleep(&ts, NULL);
  }
}
static PJRT_Error* shim_event_destroy(PJRT_Event_Destroy_Args* args) {
  if (!is_stuck(args->event)) return real_api->PJRT_Event_Destroy(args);
  return NULL;
}
#endif

#ifdef SHIM_RECORD_LAUNCH_IDS
static PJRT_Error* shim_record_execute(PJRT_LoadedExecutable_Execute_Args* args) {
  char text[48];
  snprintf(text, sizeof(text), "launch=%d;", args->options->launch_id);
  note("%.*s", text, strlen(text));
  return real_api->PJRT_LoadedExecutable_Execute(args);
}
#endif

#ifdef SHIM_NULL_CLIENT
static PJRT_Error* shim_null_client(PJRT_Client_Create_Args* args) {
  PJRT_Error* error = real_api->PJRT_Client_Create(args);
  if (error) return error;
  PJRT_Client_Destroy_Args destroy;
  memset(&destroy, 0, sizeof(destroy));
  destroy.struct_size = PJRT_Client_Destroy_Args_STRUCT_SIZE;
  destroy.client = args->client;
  real_api->PJRT_Client_Destroy(&destroy);
  args->client = NULL;
  return NULL;
}
#endif

#ifdef SHIM_CREATE_SLEEP_MS
static PJRT_Error* shim_slow_create(PJRT_Client_Create_Args* args) {
  sleep_ms(SHIM_CREATE_SLEEP_MS);
  return real_api->PJRT_Client_Create(args);
}
#endif

#ifdef SHIM_EXT_CYCLE
static PJRT_Extension_Base ext_a, ext_b;
#endif
#ifdef SHIM_EXT_BAD_SIZE
static PJRT_Extension_Base ext_bad;
#endif

#ifdef SHIM_KV
/* The plugin side of PJRT_CallbackError: record the error, hand back a token. */
static int error_token;
static PJRT_Error* shim_callback_error(PJRT_Error_Code code, const char* message, size_t size) {
  char prefix[32];
  snprintf(prefix, sizeof(prefix), "error%d=", (int)code);
  note("%.*s", prefix, strlen(prefix));
  note("%.*s;", message, size);
  return (PJRT_Error*)&error_token;
}
static PJRT_CallbackError callback_error = shim_callback_error;

static void kv_put(PJRT_Client_Create_Args* create, const char* key, const char* value) {
  PJRT_KeyValuePutCallback_Args args;
  memset(&args, 0, sizeof(args));
  args.struct_size = PJRT_KeyValuePutCallback_Args_STRUCT_SIZE;
  args.key = key;
  args.key_size = strlen(key);
  args.value = value;
  args.value_size = strlen(value);
  args.callback_error = &callback_error;
  args.user_arg = create->kv_put_user_arg;
  PJRT_Error* err = create->kv_put_callback(&args);
  note("put=%.*s;", err ? "error" : "ok", err ? 5 : 2);
}

static void kv_get(PJRT_Client_Create_Args* create, const char* key, int timeout_ms) {
  PJRT_KeyValueGetCallback_Args args;
  memset(&args, 0, sizeof(args));
  args.struct_size = PJRT_KeyValueGetCallback_Args_STRUCT_SIZE;
  args.key = key;
  args.key_size = strlen(key);
  args.timeout_in_ms = timeout_ms;
  args.callback_error = &callback_error;
  args.user_arg = create->kv_get_user_arg;
  PJRT_Error* err = create->kv_get_callback(&args);
  if (err) return; /* recorded by shim_callback_error */
  note("get=%.*s;", args.value, args.value_size);
  if (args.value_deleter_callback) args.value_deleter_callback(args.value);
  else note("%.*s", "nodeleter;", 10);
}

static void kv_try_get(PJRT_Client_Create_Args* create, const char* key) {
  PJRT_KeyValueTryGetCallback_Args args;
  memset(&args, 0, sizeof(args));
  args.struct_size = PJRT_KeyValueTryGetCallback_Args_STRUCT_SIZE;
  args.key = key;
  args.key_size = strlen(key);
  args.callback_error = &callback_error;
  args.user_arg = create->kv_try_get_user_arg;
  PJRT_Error* err = create->kv_try_get_callback(&args);
  if (err) return;
  note("try_get=%.*s;", args.value, args.value_size);
  if (args.value_deleter_callback) args.value_deleter_callback(args.value);
}

static PJRT_Error* shim_client_create(PJRT_Client_Create_Args* args) {
  report[0] = '\0';
  if (args->kv_put_callback && args->kv_get_callback) {
    kv_put(args, "shim/key", "hello");
    kv_get(args, "shim/key", 1000);
    kv_get(args, "shim/missing", 10);
    kv_put(args, "shim/boom", "x");
    if (args->kv_try_get_callback) {
      kv_try_get(args, "shim/key");
      kv_try_get(args, "shim/missing");
    } else {
      note("%.*s", "no_try_get;", 11);
    }
  } else {
    note("%.*s", "no_kv;", 6);
  }
  return real_api->PJRT_Client_Create(args);
}
#endif

#ifdef SHIM_MEMORY_STATS
static PJRT_Error* shim_memory_stats(PJRT_Device_MemoryStats_Args* args) {
  PJRT_Device_GetDescription_Args description;
  memset(&description, 0, sizeof(description));
  description.struct_size = PJRT_Device_GetDescription_Args_STRUCT_SIZE;
  description.device = args->device;
  PJRT_Error* error = real_api->PJRT_Device_GetDescription(&description);
  if (error) return error;
  PJRT_DeviceDescription_Id_Args id;
  memset(&id, 0, sizeof(id));
  id.struct_size = PJRT_DeviceDescription_Id_Args_STRUCT_SIZE;
  id.device_description = description.device_description;
  if ((error = real_api->PJRT_DeviceDescription_Id(&id)) != NULL) return error;
  size_t keep = args->struct_size;
  PJRT_Device* device = args->device;
  memset(args, 0, keep);
  args->struct_size = keep;
  args->device = device;
  args->bytes_in_use = 1000 + id.id;
  args->peak_bytes_in_use = 5000;
  args->peak_bytes_in_use_is_set = true;
  args->bytes_limit = (int64_t)1 << 30;
  args->bytes_limit_is_set = true;
  args->num_allocs = 7;
  args->num_allocs_is_set = true;
  return NULL;
}
#endif

#ifdef SHIM_MEMORY_DESCRIPTIONS
/* The extension's layout (pjrt_c_api_memory_descriptions_extension.h, version 1), not in the 0.81 header. */
typedef struct ShimMemoryDescription { const char* kind; int kind_id; } ShimMemoryDescription;
typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_DeviceDescription* device_description;
  const ShimMemoryDescription* const* memory_descriptions;
  size_t num_memory_descriptions;
  size_t default_memory_index;
} ShimDescriptionsArgs;
typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const ShimMemoryDescription* memory_description;
  const char* kind;
  size_t kind_size;
  int kind_id;
} ShimKindArgs;
static const ShimMemoryDescription shim_device_memory = {"device", 0}, shim_pinned_memory = {"pinned_host", 1};
static const ShimMemoryDescription* const shim_descriptions[] = {&shim_pinned_memory, &shim_device_memory};
static PJRT_Error* shim_memory_descriptions(ShimDescriptionsArgs* args) {
  args->memory_descriptions = shim_descriptions;
  args->num_memory_descriptions = 2;
  args->default_memory_index = 1;
  return NULL;
}
static PJRT_Error* shim_memory_kind(ShimKindArgs* args) {
  args->kind = args->memory_description->kind;
  args->kind_size = strlen(args->kind);
  args->kind_id = args->memory_description->kind_id;
  return NULL;
}
static struct {
  PJRT_Extension_Base base;
  PJRT_Error* (*descriptions)(ShimDescriptionsArgs*);
  PJRT_Error* (*kind)(ShimKindArgs*);
} shim_descriptions_extension = {{sizeof(shim_descriptions_extension), PJRT_Extension_Type_MemoryDescriptions, NULL},
                                 shim_memory_descriptions, shim_memory_kind};
#endif

#ifdef SHIM_PROFILER
/* The plugin profiler API's layout (xla/backends/profiler/plugin/profiler_c_api.h, version 1) and the
 * Profiler extension's (pjrt_c_api_profiler_extension.h, version 1); neither is in the 0.81 header. */
typedef struct { int code; char message[64]; } ShimProfilerError;
typedef struct { size_t struct_size; void* priv; ShimProfilerError* error; } ShimErrorDestroyArgs;
typedef struct { size_t struct_size; void* priv; const ShimProfilerError* error; const char* message; size_t message_size; } ShimErrorMessageArgs;
typedef struct { size_t struct_size; void* priv; const ShimProfilerError* error; int code; } ShimErrorCodeArgs;
#define SHIM_MAX_EVENTS 256
typedef struct {
  int running;
  int64_t start_ns, event_start[SHIM_MAX_EVENTS], event_end[SHIM_MAX_EVENTS];
  size_t events;
  unsigned char xspace[SHIM_MAX_EVENTS * 32 + 256];
  size_t xspace_size;
} ShimProfiler;
typedef struct { size_t struct_size; const char* options; size_t options_size; ShimProfiler* profiler; } ShimCreateArgs;
typedef struct { size_t struct_size; ShimProfiler* profiler; } ShimProfilerArgs;
typedef struct { size_t struct_size; ShimProfiler* profiler; uint8_t* buffer; size_t buffer_size_in_bytes; } ShimCollectArgs;

static ShimProfiler* volatile shim_active_profiler;
static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}
static void shim_profiler_error_destroy(ShimErrorDestroyArgs* args) { free(args->error); }
static void shim_profiler_error_message(ShimErrorMessageArgs* args) {
  args->message = args->error->message;
  args->message_size = strlen(args->error->message);
}
static ShimProfilerError* shim_profiler_error_code(ShimErrorCodeArgs* args) {
  args->code = args->error->code;
  return NULL;
}
static ShimProfilerError* shim_profiler_create(ShimCreateArgs* args) {
  args->profiler = calloc(1, sizeof(ShimProfiler));
  return NULL;
}
static ShimProfilerError* shim_profiler_destroy(ShimProfilerArgs* args) {
  if (shim_active_profiler == args->profiler) shim_active_profiler = NULL;
  free(args->profiler);
  return NULL;
}
static ShimProfilerError* shim_profiler_start(ShimProfilerArgs* args) {
#ifdef SHIM_PROFILER_FAIL_START
  ShimProfilerError* error = calloc(1, sizeof(ShimProfilerError));
  error->code = PJRT_Error_Code_UNAVAILABLE;
  snprintf(error->message, sizeof(error->message), "shim profiler: no tracer here");
  return error;
#endif
  args->profiler->running = 1;
  args->profiler->events = 0;
  args->profiler->start_ns = now_ns();
  shim_active_profiler = args->profiler;
  return NULL;
}
static ShimProfilerError* shim_profiler_stop(ShimProfilerArgs* args) {
  args->profiler->running = 0;
  shim_active_profiler = NULL;
  return NULL;
}
/* Protobuf wire format, just enough for XSpace { XPlane { XLine { XEvent } , event_metadata } }. */
static size_t put_varint(unsigned char* out, uint64_t value) {
  size_t n = 0;
  do {
    unsigned char byte = value & 0x7F;
    value >>= 7;
    out[n++] = byte | (value ? 0x80 : 0);
  } while (value);
  return n;
}
static size_t put_int(unsigned char* out, int field, int64_t value) {
  size_t n = put_varint(out, (uint64_t)(field << 3));
  return n + put_varint(out + n, (uint64_t)value);
}
static size_t put_bytes(unsigned char* out, int field, const void* data, size_t size) {
  size_t n = put_varint(out, (uint64_t)((field << 3) | 2));
  n += put_varint(out + n, size);
  memcpy(out + n, data, size);
  return n + size;
}
static ShimProfilerError* shim_profiler_collect(ShimCollectArgs* args) {
  ShimProfiler* p = args->profiler;
  unsigned char line[SHIM_MAX_EVENTS * 32 + 64], event[32], plane[SHIM_MAX_EVENTS * 32 + 192], meta[64], entry[80];
  size_t line_size = put_int(line, 1, 1);
  line_size += put_bytes(line + line_size, 2, "Execute", 7);
  line_size += put_int(line + line_size, 3, p->start_ns);
  for (size_t i = 0; i < p->events; i++) {
    size_t e = put_int(event, 1, 1);
    e += put_int(event + e, 2, (p->event_start[i] - p->start_ns) * 1000);
    e += put_int(event + e, 3, (p->event_end[i] - p->event_start[i]) * 1000);
    line_size += put_bytes(line + line_size, 4, event, e);
  }
  size_t m = put_int(meta, 1, 1);
  m += put_bytes(meta + m, 2, "shim_execute", 12);
  size_t en = put_int(entry, 1, 1);
  en += put_bytes(entry + en, 2, meta, m);
  size_t plane_size = put_int(plane, 1, 1);
  plane_size += put_bytes(plane + plane_size, 2, "/device:SHIM:0", 14);
  plane_size += put_bytes(plane + plane_size, 3, line, line_size);
  plane_size += put_bytes(plane + plane_size, 4, entry, en);
  p->xspace_size = put_bytes(p->xspace, 1, plane, plane_size);
  p->xspace_size += put_bytes(p->xspace + p->xspace_size, 4, "shim-host", 9);
  if (args->buffer == NULL) {
    args->buffer = p->xspace;  /* the plugin's own copy, as XLA's profilers hand it out */
  } else {
    memcpy(args->buffer, p->xspace, p->xspace_size);
  }
  args->buffer_size_in_bytes = p->xspace_size;
  return NULL;
}
static struct {
  size_t struct_size;
  void* priv;
  void* error_destroy;
  void* error_message;
  void* error_get_code;
  void* create;
  void* destroy;
  void* start;
  void* stop;
  void* collect_data;
} shim_profiler_api = {sizeof(shim_profiler_api), NULL, shim_profiler_error_destroy, shim_profiler_error_message,
                       shim_profiler_error_code, shim_profiler_create, shim_profiler_destroy, shim_profiler_start,
                       shim_profiler_stop, shim_profiler_collect};
static struct {
  PJRT_Extension_Base base;
  void* profiler_api;
  int64_t traceme_context_id;
} shim_profiler_extension = {{sizeof(shim_profiler_extension), PJRT_Extension_Type_Profiler, NULL}, &shim_profiler_api, 0};

static PJRT_Error* shim_profiled_execute(PJRT_LoadedExecutable_Execute_Args* args) {
  int64_t start = now_ns();
  PJRT_Error* error = real_api->PJRT_LoadedExecutable_Execute(args);
  ShimProfiler* p = shim_active_profiler;
  if (p != NULL && p->running && p->events < SHIM_MAX_EVENTS) {
    size_t i = p->events++;
    p->event_start[i] = start;
    p->event_end[i] = now_ns();
  }
  return error;
}
#endif

#ifdef SHIM_NULL_DATA_POINTER
static PJRT_Error* shim_null_data_pointer(PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args* args) {
  PJRT_Error* error = real_api->PJRT_Buffer_OpaqueDeviceMemoryDataPointer(args);
  if (error == NULL) args->device_memory_ptr = NULL;
  return error;
}
#endif

#ifdef SHIM_NULL_OUTPUT
static PJRT_Error* shim_null_output(PJRT_LoadedExecutable_Execute_Args* args) {
  PJRT_Error* error = real_api->PJRT_LoadedExecutable_Execute(args);
  if (error != NULL || args->num_devices == 0) return error;
  PJRT_Buffer_Destroy_Args destroy;
  memset(&destroy, 0, sizeof(destroy));
  destroy.struct_size = PJRT_Buffer_Destroy_Args_STRUCT_SIZE;
  destroy.buffer = args->output_lists[args->num_devices - 1][0];
  real_api->PJRT_Buffer_Destroy(&destroy);
  args->output_lists[args->num_devices - 1][0] = NULL;
  return NULL;
}
#endif

#ifdef SHIM_NULL_EXECUTABLE
static PJRT_Error* shim_null_executable(PJRT_Client_Compile_Args* args) {
  PJRT_Error* error = real_api->PJRT_Client_Compile(args);
  if (error != NULL) return error;
  PJRT_LoadedExecutable_Destroy_Args destroy;
  memset(&destroy, 0, sizeof(destroy));
  destroy.struct_size = PJRT_LoadedExecutable_Destroy_Args_STRUCT_SIZE;
  destroy.executable = args->executable;
  real_api->PJRT_LoadedExecutable_Destroy(&destroy);
  args->executable = NULL;
  return NULL;
}
#endif

#ifdef SHIM_NULL_READY_EVENT
static PJRT_Error* shim_null_ready_event(PJRT_Buffer_ReadyEvent_Args* args) {
  PJRT_Error* error = real_api->PJRT_Buffer_ReadyEvent(args);
  if (error != NULL) return error;
  PJRT_Event_Destroy_Args destroy;
  memset(&destroy, 0, sizeof(destroy));
  destroy.struct_size = PJRT_Event_Destroy_Args_STRUCT_SIZE;
  destroy.event = args->event;
  real_api->PJRT_Event_Destroy(&destroy);
  args->event = NULL;
  return NULL;
}
#endif

#ifdef SHIM_LYING_LISTS
static PJRT_Memory* lying_memories[1];
static PJRT_Error* shim_lying_devices(PJRT_Client_Devices_Args* args) {
  PJRT_Error* error = real_api->PJRT_Client_Devices(args);
  if (error == NULL) args->devices = NULL;
  return error;
}
static PJRT_Error* shim_lying_addressable(PJRT_Client_AddressableDevices_Args* args) {
  PJRT_Error* error = real_api->PJRT_Client_AddressableDevices(args);
  if (error == NULL) args->num_addressable_devices = (size_t)-1;
  return error;
}
static PJRT_Error* shim_lying_lookup(PJRT_Client_LookupDevice_Args* args) {
  PJRT_Error* error = real_api->PJRT_Client_LookupDevice(args);
  if (error == NULL) args->device = NULL;
  return error;
}
static PJRT_Error* shim_lying_memories(PJRT_Device_AddressableMemories_Args* args) {
  PJRT_Error* error = real_api->PJRT_Device_AddressableMemories(args);
  if (error == NULL) {
    args->memories = lying_memories;
    args->num_memories = 1;
  }
  return error;
}
#endif

const PJRT_Api* GetPjrtApi(void) {
#ifdef SHIM_NULL_API
  return NULL;
#endif
#ifdef SHIM_GET_API_SLEEP_MS
  sleep_ms(SHIM_GET_API_SLEEP_MS);
#endif
  if (real_api) return &shim_api;
  void* handle = dlopen(SHIM_TARGET, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (!handle) return NULL;
  const PJRT_Api* (*get)(void) = (const PJRT_Api* (*)(void))dlsym(handle, "GetPjrtApi");
  if (!get) return NULL;
  real_api = get();
  size_t size = real_api->struct_size < sizeof(shim_api) ? real_api->struct_size : sizeof(shim_api);
  memcpy(&shim_api, real_api, size);
#ifdef SHIM_MAJOR
  shim_api.pjrt_api_version.major_version = SHIM_MAJOR;
#endif
#ifdef SHIM_MINOR
  shim_api.pjrt_api_version.minor_version = SHIM_MINOR;
#endif
#ifdef SHIM_SLOTS
  shim_api.struct_size = offsetof(PJRT_Api, PJRT_Error_Destroy) + sizeof(void*) * (SHIM_SLOTS);
#endif
#ifdef SHIM_NULL_SLOT
  shim_api.SHIM_NULL_SLOT = NULL;
#endif
#ifdef SHIM_INIT_SLEEP_MS
  shim_api.PJRT_Plugin_Initialize = shim_initialize;
#endif
#ifdef SHIM_EXT_CYCLE
  ext_a.struct_size = sizeof(PJRT_Extension_Base);
  ext_a.type = PJRT_Extension_Type_Example;
  ext_a.next = &ext_b;
  ext_b.struct_size = sizeof(PJRT_Extension_Base);
  ext_b.type = PJRT_Extension_Type_Profiler;
  ext_b.next = &ext_a;
  shim_api.extension_start = &ext_a;
#endif
#ifdef SHIM_EXT_BAD_SIZE
  ext_bad.struct_size = 8;
  ext_bad.type = PJRT_Extension_Type_Example;
  ext_bad.next = NULL;
  shim_api.extension_start = &ext_bad;
#endif
#ifdef SHIM_KV
  shim_api.PJRT_Client_Create = shim_client_create;
#endif
#ifdef SHIM_NOT_ON_CPU
  shim_api.PJRT_Buffer_IsOnCpu = shim_is_on_cpu;
#endif
#if defined(SHIM_FAIL_BUFFER_DESTROY) || defined(SHIM_FAIL_EVENT_IS_READY)
  shim_api.PJRT_Client_Create = shim_create_recording;
  shim_api.PJRT_Client_Destroy = shim_client_destroy;
  shim_api.PJRT_LoadedExecutable_Destroy = shim_executable_destroy;
  shim_api.PJRT_Buffer_Destroy = shim_buffer_destroy;
#endif
#ifdef SHIM_FAIL_EVENT_IS_READY
  shim_api.PJRT_Event_IsReady = shim_event_is_ready;
#endif
#ifdef SHIM_MAKES_ERRORS
  shim_api.PJRT_Client_Create = shim_create_recording;
#endif
#if defined(SHIM_FAIL_EXECUTION) || defined(SHIM_FAIL_EVENT_DESTROY)
  shim_api.PJRT_LoadedExecutable_Execute = shim_recording_execute;
  shim_api.PJRT_Event_Await = shim_completion_await;
  shim_api.PJRT_Event_Destroy = shim_completion_destroy;
#endif
#ifdef SHIM_FAIL_DATA_POINTER
  shim_api.PJRT_Buffer_IncreaseExternalReferenceCount = shim_hold;
  shim_api.PJRT_Buffer_DecreaseExternalReferenceCount = shim_unhold;
  shim_api.PJRT_Buffer_OpaqueDeviceMemoryDataPointer = shim_data_pointer;
#endif
#ifdef SHIM_CHECK_LIFETIMES
  shim_api.PJRT_Client_Create = lt_client_create;
  shim_api.PJRT_Client_Destroy = lt_client_destroy;
  shim_api.PJRT_Client_Compile = lt_compile;
  shim_api.PJRT_Client_BufferFromHostBuffer = lt_from_host;
  shim_api.PJRT_Buffer_ToHostBuffer = lt_to_host;
  shim_api.PJRT_LoadedExecutable_Execute = lt_execute;
  shim_api.PJRT_Buffer_Destroy = lt_buffer_destroy;
  shim_api.PJRT_LoadedExecutable_Destroy = lt_executable_destroy;
#endif
#ifdef SHIM_STUCK_EXECUTE
  shim_api.PJRT_LoadedExecutable_Execute = shim_stuck_execute;
  shim_api.PJRT_Event_IsReady = shim_event_is_ready_stuck;
  shim_api.PJRT_Event_OnReady = shim_event_on_ready;
  shim_api.PJRT_Event_Await = shim_event_await;
  shim_api.PJRT_Event_Destroy = shim_event_destroy;
#endif
#ifdef SHIM_RECORD_LAUNCH_IDS
  shim_api.PJRT_LoadedExecutable_Execute = shim_record_execute;
#endif
#ifdef SHIM_NULL_CLIENT
  shim_api.PJRT_Client_Create = shim_null_client;
#endif
#ifdef SHIM_CREATE_SLEEP_MS
  shim_api.PJRT_Client_Create = shim_slow_create;
#endif
#ifdef SHIM_MEMORY_STATS
  shim_api.PJRT_Device_MemoryStats = shim_memory_stats;
#endif
#if defined(SHIM_MEMORY_DESCRIPTIONS) || defined(SHIM_PROFILER)
  {
    PJRT_Extension_Base* chain = NULL;
#ifdef SHIM_MEMORY_DESCRIPTIONS
    shim_descriptions_extension.base.next = chain;
    chain = &shim_descriptions_extension.base;
#endif
#ifdef SHIM_PROFILER
    shim_profiler_extension.base.next = chain;
    chain = &shim_profiler_extension.base;
    shim_api.PJRT_LoadedExecutable_Execute = shim_profiled_execute;
#endif
    shim_api.extension_start = chain;  /* instead of the real plugin's extensions */
  }
#endif
#ifdef SHIM_NULL_DATA_POINTER
  shim_api.PJRT_Buffer_OpaqueDeviceMemoryDataPointer = shim_null_data_pointer;
#endif
#ifdef SHIM_NULL_OUTPUT
  shim_api.PJRT_LoadedExecutable_Execute = shim_null_output;
#endif
#ifdef SHIM_NULL_EXECUTABLE
  shim_api.PJRT_Client_Compile = shim_null_executable;
#endif
#ifdef SHIM_NULL_READY_EVENT
  shim_api.PJRT_Buffer_ReadyEvent = shim_null_ready_event;
#endif
#ifdef SHIM_LYING_LISTS
  shim_api.PJRT_Client_Devices = shim_lying_devices;
  shim_api.PJRT_Client_AddressableDevices = shim_lying_addressable;
  shim_api.PJRT_Client_LookupDevice = shim_lying_lookup;
  shim_api.PJRT_Device_AddressableMemories = shim_lying_memories;
#endif
#ifdef SHIM_OVERSTATE_TABLE
  for (size_t i = 0; i < sizeof(shim_table.tail) / sizeof(shim_table.tail[0]); i++) shim_table.tail[i] = &report[i];
  shim_api.struct_size = sizeof(shim_table);
#endif
  return &shim_api;
}
