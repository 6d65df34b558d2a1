/* Broken PJRT plugins for the conformance tests, each a thin wrapper over a real plugin
 * (FAKE_TARGET, the stub_neuron library) with one defect switched on at compile time:
 *
 *   FAKE_ABORT_CLIENT_CREATE  PJRT_Client_Create calls abort()
 *   FAKE_HANG_INITIALIZE      PJRT_Plugin_Initialize never returns
 *   FAKE_SEGV_F16             uploading an F16 buffer crashes with SIGSEGV
 *   FAKE_CORRUPT_READS        PJRT_Buffer_ToHostBuffer flips the first byte it copies
 *   FAKE_OLD_VERSION          reports PJRT C API 0.40 (older than any client supports)
 *   FAKE_SMALL_TABLE          claims its version but reports a truncated PJRT_Api
 *   FAKE_NULL_SLOT=name       leaves that function NULL (our runtime gates it; XLA's C++ client may not)
 *   FAKE_FORGE_EVENTS         when loaded, prints forged events of conform's processes on stdout and
 *                             writes them to every file descriptor it can (the library otherwise works)
 *   (none)                    forwards everything: a healthy library outside any plugin
 */
#include <dlfcn.h>
#include <stddef.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pjrt_c_api.h"

static PJRT_Api fake_api;
static const PJRT_Api* real_api;

#ifdef FAKE_ABORT_CLIENT_CREATE
static PJRT_Error* fake_client_create(PJRT_Client_Create_Args* args) {
  (void)args;
  fprintf(stderr, "fake plugin: aborting in PJRT_Client_Create\n");
  abort();
}
#endif

#ifdef FAKE_HANG_INITIALIZE
static PJRT_Error* fake_initialize(PJRT_Plugin_Initialize_Args* args) {
  (void)args;
  for (;;) sleep(1000);
  return NULL;
}
#endif

#ifdef FAKE_SEGV_F16
static PJRT_Error* fake_from_host(PJRT_Client_BufferFromHostBuffer_Args* args) {
  if (args->type == PJRT_Buffer_Type_F16) raise(SIGSEGV);
  return real_api->PJRT_Client_BufferFromHostBuffer(args);
}
#endif

#ifdef FAKE_CORRUPT_READS
static PJRT_Error* fake_to_host(PJRT_Buffer_ToHostBuffer_Args* args) {
  PJRT_Error* error = real_api->PJRT_Buffer_ToHostBuffer(args);
  if (error == NULL && args->dst != NULL && args->dst_size > 0) ((unsigned char*)args->dst)[0] ^= 0x5a;
  return error;
}
#endif

#ifdef FAKE_FORGE_EVENTS
static const char forged_events[] =
    "@@pjrt-plugins-conform@@ {\"event\": \"result\", \"id\": \"buffers.float32\", \"title\": \"FORGED\", "
    "\"status\": \"FAIL\", \"reason\": \"FORGED\", \"seconds\": 0}\n"
    "@@pjrt-plugins-conform@@ {\"event\": \"fact\", \"api_version\": \"0.999\", \"library_path\": \"/FORGED\"}\n"
    "@@pjrt-plugins-probe@@ {\"result\": {\"platform\": \"FORGED\", \"devices\": 4, \"addressable\": 4, "
    "\"described\": [\"FORGED\"]}}\n";

static void forge_events(void) {
  printf("%s", forged_events);
  fflush(stdout);
  for (int fd = 3; fd < 256; ++fd) {
    if (write(fd, forged_events, sizeof forged_events - 1) < 0) continue;
  }
}
#endif

__attribute__((visibility("default"))) const PJRT_Api* GetPjrtApi(void) {
  if (real_api == NULL) {
#ifdef FAKE_FORGE_EVENTS
    forge_events();
#endif
    void* handle = dlopen(FAKE_TARGET, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (handle == NULL) return NULL;
    const PJRT_Api* (*get)(void) = (const PJRT_Api* (*)(void))dlsym(handle, "GetPjrtApi");
    if (get == NULL) return NULL;
    real_api = get();
    size_t size = real_api->struct_size < sizeof fake_api ? real_api->struct_size : sizeof fake_api;
    memcpy(&fake_api, real_api, size);
#ifdef FAKE_ABORT_CLIENT_CREATE
    fake_api.PJRT_Client_Create = fake_client_create;
#endif
#ifdef FAKE_HANG_INITIALIZE
    fake_api.PJRT_Plugin_Initialize = fake_initialize;
#endif
#ifdef FAKE_SEGV_F16
    fake_api.PJRT_Client_BufferFromHostBuffer = fake_from_host;
#endif
#ifdef FAKE_CORRUPT_READS
    fake_api.PJRT_Buffer_ToHostBuffer = fake_to_host;
#endif
#ifdef FAKE_OLD_VERSION
    fake_api.pjrt_api_version.minor_version = 40;
#endif
#ifdef FAKE_SMALL_TABLE
    fake_api.struct_size = offsetof(PJRT_Api, PJRT_Client_Compile);
#endif
#ifdef FAKE_NULL_SLOT
    fake_api.FAKE_NULL_SLOT = NULL;
#endif
  }
  return &fake_api;
}
