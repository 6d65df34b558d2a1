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
 *
 * The functions are private to the runtime, which always hands them complete plans; still, each
 * checks its arguments first and refuses what would make it read or call through NULL, or walk
 * past any plausible array, touching nothing then. So do the answers of a plugin that lies: a
 * buffer whose bytes are at NULL is refused, never copied from.
 */
#include <stdint.h>
#include <string.h>

#include "pjrt_fastpath.h"

/* Outside the declarations, which keep their enums as they are; _fastpath.py mirrors these and
 * tests/runtime/test_fastpath.py pins the two together. */
#define PJRTP_INVALID_ARGUMENTS (-1) /* pjrtp_finish_ready, pjrtp_execute, pjrtp_destroy_buffers: refused, nothing touched */
#define PJRTP_STEP_NO_DATA 3         /* pjrtp_read_pinned: the plugin gave NULL as the address of the bytes */
#define PJRTP_STEP_INVALID 4         /* pjrtp_read_pinned: arguments refused, nothing touched */
/* No process drives this many devices: a larger event count is a caller's mistake, never read. */
#define PJRTP_MAX_EVENTS 65536
/* Nor frees this many buffers in one call (the count must fit the int that counts failures). */
#define PJRTP_MAX_BUFFERS (1 << 30)

/* What pjrtp_read_pinned returns for its own two failures above: never NULL (success), never a
 * plugin's error; the caller tells it apart by failed_step and never hands it to the plugin. */
static char refused_marker;
#define PJRTP_REFUSED ((PJRT_Error*)&refused_marker)

static int event_plan_ok(const PJRTP_EventPlan* plan) {
  return plan != NULL && plan->is_ready != NULL && plan->await_event != NULL && plan->destroy_event != NULL &&
         plan->is_ready_args != NULL && plan->await_args != NULL && plan->destroy_args != NULL &&
         plan->errors != NULL && plan->destroy_errors != NULL;
}

int pjrtp_finish_ready(PJRTP_EventPlan* plan, PJRT_Event** events, size_t count) {
  if (!event_plan_ok(plan) || count > PJRTP_MAX_EVENTS || (count != 0 && events == NULL)) {
    return PJRTP_INVALID_ARGUMENTS;
  }
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
  if (plan == NULL || plan->execute == NULL || plan->execute_args == NULL || plan->launch_ids == NULL ||
      plan->execute_args->options == NULL) {
    return PJRTP_INVALID_ARGUMENTS;
  }
  PJRT_LoadedExecutable_Execute_Args* args = plan->execute_args;
  if (args->device_complete_events != NULL && (!event_plan_ok(plan->events) || args->num_devices > PJRTP_MAX_EVENTS)) {
    return PJRTP_INVALID_ARGUMENTS;
  }
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
  if (plan == NULL) return PJRTP_REFUSED;
  if (plan->hold == NULL || plan->where == NULL || plan->unhold == NULL || plan->hold_args == NULL ||
      plan->where_args == NULL || plan->unhold_args == NULL || buffer == NULL || (nbytes != 0 && dst == NULL) ||
      nbytes > PTRDIFF_MAX) {
    plan->failed_step = PJRTP_STEP_INVALID;
    return PJRTP_REFUSED;
  }
  plan->failed_step = PJRTP_STEP_HOLD;
  plan->hold_args->buffer = buffer;
  PJRT_Error* error = plan->hold(plan->hold_args);
  if (error != NULL) return error;
  plan->where_args->buffer = buffer;
  error = plan->where(plan->where_args);
  int no_data = 0;
  if (error == NULL && nbytes != 0) {
    if (plan->where_args->device_memory_ptr == NULL) {
      no_data = 1;
    } else {
      memcpy(dst, plan->where_args->device_memory_ptr, nbytes);
    }
  }
  plan->unhold_args->buffer = buffer;
  PJRT_Error* unhold_error = plan->unhold(plan->unhold_args);
  if (error != NULL || no_data) {
    plan->failed_step = no_data ? PJRTP_STEP_NO_DATA : PJRTP_STEP_WHERE;
    plan->unhold_error = unhold_error;
    return no_data ? PJRTP_REFUSED : error;
  }
  plan->failed_step = PJRTP_STEP_UNHOLD;
  return unhold_error;
}

/* Destroys every handle of buffers[] (a NULL one is skipped), each exactly once, and goes on past a
 * failure: errors[i] is the plugin's error for buffers[i] (NULL on success). Returns how many failed,
 * or PJRTP_INVALID_ARGUMENTS (nothing touched) for a plan or arrays it cannot use. The caller owns the
 * handles (taken out of its registry) and never hands one over twice. */
int pjrtp_destroy_buffers(PJRTP_DestroyPlan* plan, PJRT_Buffer** buffers, size_t count, PJRT_Error** errors) {
  if (plan == NULL || plan->destroy == NULL || plan->destroy_args == NULL || count > PJRTP_MAX_BUFFERS ||
      (count != 0 && (buffers == NULL || errors == NULL))) {
    return PJRTP_INVALID_ARGUMENTS;
  }
  int failed = 0;
  PJRT_Buffer_Destroy_Args* args = plan->destroy_args;
  for (size_t i = 0; i < count; i++) {
    errors[i] = NULL;
    if (buffers[i] == NULL) continue;
    args->buffer = buffers[i];
    errors[i] = plan->destroy(args);
    if (errors[i] != NULL) failed++;
  }
  return failed;
}

unsigned long pjrtp_declarations_crc(void) { return PJRTP_DECLARATIONS_CRC; }
