/* The runtime's hot paths in C: each function replaces a sequence of PJRT C API calls that
 * Python would otherwise make one by one through libffi (about 0.2 us each, plus the Python
 * around them). Plain C without the Python API: the runtime loads it with its own cffi FFI,
 * and calls the plugin's functions through the pointers it already checked (Library.function).
 *
 * Nothing here blocks: an event is awaited only once PJRT_Event_IsReady says it is ready, so
 * a program still running leaves its events to the runtime's bounded, interruptible wait
 * (pjrtp_finish_ready serves every wait of the runtime, ReadyEvents in _events.py).
 *
 * "pjrt_fastpath.h" is written at build time (runtime/_build_fastpath.py) from _cdef.CDEF and
 * _cdef.FASTPATH_DECLARATIONS, the same text the runtime gives cffi: one set of declarations.
 */
#include <string.h>

#include "pjrt_fastpath.h"

int pjrtp_finish_ready(PJRTP_EventPlan* plan, PJRT_Event** events, size_t count) {
  PJRT_Event_IsReady_Args* ready = plan->is_ready_args;
  for (size_t i = 0; i < count; i++) {
    if (events[i] == NULL) continue;
    ready->event = events[i];
    PJRT_Error* error = plan->is_ready(ready);
    if (error != NULL) {  /* the plugin cannot say: the caller waits for callbacks instead */
      plan->errors[0] = error;
      return PJRTP_READINESS_UNKNOWN;
    }
    if (!ready->is_ready) return PJRTP_RUNNING;
  }
  /* All ready: PJRT_Event_Await returns at once. Each event is destroyed, whatever happens. */
  int status = PJRTP_DONE;
  for (size_t i = 0; i < count; i++) {
    plan->errors[i] = NULL;
    plan->destroy_errors[i] = NULL;
    if (events[i] == NULL) continue;
    plan->await_args->event = events[i];
    plan->errors[i] = plan->await_event(plan->await_args);
    plan->destroy_args->event = events[i];
    plan->destroy_errors[i] = plan->destroy_event(plan->destroy_args);
    if (plan->errors[i] != NULL || plan->destroy_errors[i] != NULL) status = PJRTP_DONE_WITH_ERRORS;
  }
  return status;
}

int pjrtp_execute(PJRTP_ExecutePlan* plan) {
  PJRT_LoadedExecutable_Execute_Args* args = plan->execute_args;
  /* Executes on several threads at once share the counter (cffi calls run without the GIL). */
  int64_t launch = __atomic_fetch_add(plan->launch_ids, 1, __ATOMIC_RELAXED);
  args->options->launch_id = (int)(launch % 2147483648LL);
  PJRT_Error* error = plan->execute(args);
  if (error != NULL) {
    plan->execute_error = error;
    return PJRTP_EXECUTE_FAILED;
  }
  if (args->device_complete_events == NULL) return PJRTP_DONE;
  return pjrtp_finish_ready(plan->events, args->device_complete_events, args->num_devices);
}

PJRT_Error* pjrtp_read_pinned(PJRTP_ReadPlan* plan, PJRT_Buffer* buffer, char* dst, size_t nbytes) {
  plan->failed_step = PJRTP_STEP_HOLD;
  plan->hold_args->buffer = buffer;
  PJRT_Error* error = plan->hold(plan->hold_args);
  if (error != NULL) return error;
  plan->where_args->buffer = buffer;
  error = plan->where(plan->where_args);
  if (error == NULL && nbytes != 0) memcpy(dst, plan->where_args->device_memory_ptr, nbytes);
  plan->unhold_args->buffer = buffer;
  PJRT_Error* unhold_error = plan->unhold(plan->unhold_args);
  if (error != NULL) {
    plan->failed_step = PJRTP_STEP_WHERE;
    plan->unhold_error = unhold_error;
    return error;
  }
  plan->failed_step = PJRTP_STEP_UNHOLD;
  return unhold_error;
}

unsigned long pjrtp_declarations_crc(void) { return PJRTP_DECLARATIONS_CRC; }
