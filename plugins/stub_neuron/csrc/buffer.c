/* Host-memory buffers of the stub_neuron plugin: upload (honouring byte
 * strides), download (with the size query), metadata, delete and destroy.
 *
 * "Device memory" is a malloc'd dense row-major copy. Uploads always copy
 * during the call, which satisfies every PJRT_HostBufferSemantics.
 */
#include <stdlib.h>
#include <string.h>

#include "stub_neuron.h"

/* Bytes per element as laid out in host memory; 0 for unsupported types.
 * Sub-byte types (S4, U4, S2, U2, F4E2M1FN) take one byte per element on the
 * host, as numpy / ml_dtypes store them. */
static size_t element_size(PJRT_Buffer_Type type) {
  switch (type) {
    case PJRT_Buffer_Type_PRED:
    case PJRT_Buffer_Type_S8:
    case PJRT_Buffer_Type_U8:
    case PJRT_Buffer_Type_S4:
    case PJRT_Buffer_Type_U4:
    case PJRT_Buffer_Type_S2:
    case PJRT_Buffer_Type_U2:
    case PJRT_Buffer_Type_F8E5M2:
    case PJRT_Buffer_Type_F8E4M3FN:
    case PJRT_Buffer_Type_F8E4M3B11FNUZ:
    case PJRT_Buffer_Type_F8E5M2FNUZ:
    case PJRT_Buffer_Type_F8E4M3FNUZ:
    case PJRT_Buffer_Type_F8E4M3:
    case PJRT_Buffer_Type_F8E3M4:
    case PJRT_Buffer_Type_F8E8M0FNU:
    case PJRT_Buffer_Type_F4E2M1FN:
      return 1;
    case PJRT_Buffer_Type_S16:
    case PJRT_Buffer_Type_U16:
    case PJRT_Buffer_Type_F16:
    case PJRT_Buffer_Type_BF16:
      return 2;
    case PJRT_Buffer_Type_S32:
    case PJRT_Buffer_Type_U32:
    case PJRT_Buffer_Type_F32:
      return 4;
    case PJRT_Buffer_Type_S64:
    case PJRT_Buffer_Type_U64:
    case PJRT_Buffer_Type_F64:
    case PJRT_Buffer_Type_C64:
      return 8;
    case PJRT_Buffer_Type_C128:
      return 16;
    default: /* INVALID, TOKEN and anything newer than this header */
      return 0;
  }
}

/* Only the default layout (dense, major-to-minor) is supported.
 *
 * The layout's own struct_size (and that of the tiled and strides structs inside it) is
 * never read. XLA's C++ client (PjRtCApiClient: JAX, torch_xla) fills the layouts it
 * passes as host_layout and device_layout with pjrt::ConvertToBufferMemoryLayoutData,
 * which sets `type` and the tiled fields only: struct_size is whatever was on its stack
 * (seen as 1, at random, under jax 0.12), and XLA's own plugins do not read it either.
 * Which fields exist is settled by the args struct that points here, whose struct_size
 * was checked: PJRT_Buffer_MemoryLayout has not changed since it was added. */
static PJRT_Error* check_dense_layout(const PJRT_Buffer_MemoryLayout* layout, size_t num_dims,
                                      const int64_t* dims, size_t esize, const char* function) {
  if (layout == NULL) return NULL;
  bool dense = false;
  if (layout->type == PJRT_Buffer_MemoryLayout_Type_Tiled) {
    const PJRT_Buffer_MemoryLayout_Tiled* tiled = &layout->tiled;
    dense = tiled->num_tiles == 0 &&
            tiled->minor_to_major_size == num_dims && (num_dims == 0 || tiled->minor_to_major != NULL);
    for (size_t i = 0; dense && i < num_dims; ++i) dense = tiled->minor_to_major[i] == (int64_t)(num_dims - 1 - i);
  } else if (layout->type == PJRT_Buffer_MemoryLayout_Type_Strides) {
    const PJRT_Buffer_MemoryLayout_Strides* strides = &layout->strides;
    dense = strides->num_byte_strides == num_dims && (num_dims == 0 || strides->byte_strides != NULL);
    int64_t expected = (int64_t)esize;
    for (size_t i = num_dims; dense && i-- > 0;) {
      dense = dims[i] <= 1 || strides->byte_strides[i] == expected;
      expected *= dims[i];
    }
  }
  if (!dense) {
    return stub_error(PJRT_Error_Code_UNIMPLEMENTED,
                      "%s: the stub_neuron plugin only supports the default dense major-to-minor layout", function);
  }
  return NULL;
}

/* Copies a strided host array into dense row-major storage. Strides may be
 * negative (then `src` points inside the array). */
static void gather_strided(char* dst, const char* src, const int64_t* dims, const int64_t* strides,
                           size_t num_dims, size_t esize, size_t num_elements) {
  if (num_elements == 0) return;
  if (num_dims == 0) {
    memcpy(dst, src, esize);
    return;
  }
  int64_t index[STUB_MAX_DIMS] = {0};
  size_t inner = (size_t)dims[num_dims - 1];
  int64_t inner_stride = strides[num_dims - 1];
  for (size_t row = 0; row < num_elements / inner; ++row) {
    const char* from = src;
    for (size_t d = 0; d + 1 < num_dims; ++d) from += index[d] * strides[d];
    if (inner_stride == (int64_t)esize) {
      memcpy(dst, from, inner * esize);
      dst += inner * esize;
    } else {
      for (size_t k = 0; k < inner; ++k, dst += esize) memcpy(dst, from + (int64_t)k * inner_stride, esize);
    }
    for (size_t d = num_dims - 1; d-- > 0;) { /* odometer over the outer dimensions */
      if (++index[d] < dims[d]) break;
      index[d] = 0;
    }
  }
}

/* Resolves the target device of an upload; only this client's addressable devices qualify. */
static PJRT_Error* upload_target(const PJRT_Client_BufferFromHostBuffer_Args* args, PJRT_Device** device) {
  PJRT_Client* client = args->client;
  if (args->memory != NULL) { /* the memory wins over the device, as the header says */
    for (size_t i = 0; i < client->num_addressable; ++i) {
      if (client->memory_ptrs[i] == args->memory) {
        *device = client->memory_ptrs[i]->device;
        return NULL;
      }
    }
    return stub_error(PJRT_Error_Code_INVALID_ARGUMENT,
                      "PJRT_Client_BufferFromHostBuffer: memory is not an addressable memory of this client");
  }
  if (args->device == NULL) {
    return stub_error(PJRT_Error_Code_INVALID_ARGUMENT,
                      "PJRT_Client_BufferFromHostBuffer: set device or memory to say where the buffer goes");
  }
  for (size_t i = 0; i < client->num_addressable; ++i) {
    if (client->addressable_ptrs[i] == args->device) {
      *device = args->device;
      return NULL;
    }
  }
  for (size_t i = 0; i < client->num_devices; ++i) {
    if (client->device_ptrs[i] == args->device) {
      return stub_error(PJRT_Error_Code_INVALID_ARGUMENT,
                        "PJRT_Client_BufferFromHostBuffer: device %d belongs to process %d and is not addressable "
                        "from process %d",
                        args->device->description.id, args->device->description.process_index, client->node_id);
    }
  }
  return stub_error(PJRT_Error_Code_INVALID_ARGUMENT,
                    "PJRT_Client_BufferFromHostBuffer: device does not belong to this client");
}

/* Checks type and shape; sets the element size and the dense byte count. */
static PJRT_Error* check_shape(const PJRT_Client_BufferFromHostBuffer_Args* args, size_t* esize, size_t* num_bytes,
                               size_t* num_elements) {
  const char* fn = "PJRT_Client_BufferFromHostBuffer";
  *esize = element_size(args->type);
  if (*esize == 0) {
    return stub_error(PJRT_Error_Code_INVALID_ARGUMENT, "%s: element type %d is not supported by stub_neuron", fn,
                      (int)args->type);
  }
  if (args->num_dims > STUB_MAX_DIMS) {
    return stub_error(PJRT_Error_Code_INVALID_ARGUMENT, "%s: %zu dimensions exceed the limit of %d", fn,
                      args->num_dims, STUB_MAX_DIMS);
  }
  if (args->num_dims > 0 && args->dims == NULL) {
    return stub_error(PJRT_Error_Code_INVALID_ARGUMENT, "%s: num_dims is %zu but dims is NULL", fn, args->num_dims);
  }
  size_t count = 1;
  for (size_t i = 0; i < args->num_dims; ++i) {
    if (args->dims[i] < 0) {
      return stub_error(PJRT_Error_Code_INVALID_ARGUMENT, "%s: dimension %zu is negative (%lld)", fn, i,
                        (long long)args->dims[i]);
    }
    if (args->dims[i] != 0 && count > SIZE_MAX / 2 / (size_t)args->dims[i] / *esize) {
      return stub_error(PJRT_Error_Code_RESOURCE_EXHAUSTED, "%s: the array is too large", fn);
    }
    count *= (size_t)args->dims[i];
  }
  if (args->num_byte_strides != 0 && args->num_byte_strides != args->num_dims) {
    return stub_error(PJRT_Error_Code_INVALID_ARGUMENT, "%s: %zu byte strides given for %zu dimensions", fn,
                      args->num_byte_strides, args->num_dims);
  }
  if (args->num_byte_strides != 0 && args->byte_strides == NULL) {
    return stub_error(PJRT_Error_Code_INVALID_ARGUMENT, "%s: num_byte_strides is %zu but byte_strides is NULL", fn,
                      args->num_byte_strides);
  }
  if ((unsigned)args->host_buffer_semantics > (unsigned)PJRT_HostBufferSemantics_kMutableZeroCopy) {
    return stub_error(PJRT_Error_Code_INVALID_ARGUMENT, "%s: unknown host_buffer_semantics %d", fn,
                      (int)args->host_buffer_semantics);
  }
  if (count > 0 && args->data == NULL) {
    return stub_error(PJRT_Error_Code_INVALID_ARGUMENT, "%s: data is NULL for a non-empty array", fn);
  }
  *num_elements = count;
  *num_bytes = count * *esize;
  return NULL;
}

static void buffer_free(PJRT_Buffer* buffer) {
  if (buffer->client != NULL) stub_client_release(buffer->client);
  pthread_mutex_destroy(&buffer->mu);
  free(buffer->data);
  free(buffer->dims);
  buffer->magic = STUB_MAGIC_DEAD;
  stub_free(buffer);
}

PJRT_Error* StubClient_BufferFromHostBuffer(PJRT_Client_BufferFromHostBuffer_Args* args) {
  STUB_CHECK_ARGS(args, PJRT_Client_BufferFromHostBuffer_Args);
  args->buffer = NULL;
  args->done_with_host_buffer = NULL;
  PJRT_Error* error = stub_check_client(args->client, "PJRT_Client_BufferFromHostBuffer");
  if (error != NULL) return error;
  size_t esize = 0, num_bytes = 0, num_elements = 0;
  PJRT_Device* device = NULL;
  if ((error = check_shape(args, &esize, &num_bytes, &num_elements)) != NULL) return error;
  if ((error = upload_target(args, &device)) != NULL) return error;
  error = check_dense_layout(args->device_layout, args->num_dims, args->dims, esize,
                             "PJRT_Client_BufferFromHostBuffer (device_layout)");
  if (error != NULL) return error;

  PJRT_Buffer* buffer = stub_alloc(sizeof(PJRT_Buffer));
  if (buffer == NULL) return stub_error(PJRT_Error_Code_RESOURCE_EXHAUSTED, "stub_neuron: out of memory");
  buffer->magic = STUB_MAGIC_BUFFER;
  pthread_mutex_init(&buffer->mu, NULL);
  buffer->type = args->type;
  buffer->num_dims = args->num_dims;
  buffer->element_size = esize;
  buffer->num_bytes = num_bytes;
  buffer->device = device;
  /* dims, then the default layout's minor_to_major, in one allocation. */
  buffer->dims = malloc((args->num_dims > 0 ? 2 * args->num_dims : 1) * sizeof(int64_t));
  buffer->data = malloc(num_bytes > 0 ? num_bytes : 1);
  if (buffer->dims == NULL || buffer->data == NULL) {
    buffer_free(buffer);
    return stub_error(PJRT_Error_Code_RESOURCE_EXHAUSTED, "stub_neuron: out of memory for %zu bytes", num_bytes);
  }
  if (args->num_dims > 0) memcpy(buffer->dims, args->dims, args->num_dims * sizeof(int64_t));
  buffer->minor_to_major = buffer->dims + args->num_dims;
  for (size_t i = 0; i < args->num_dims; ++i) buffer->minor_to_major[i] = (int64_t)(args->num_dims - 1 - i);

  if (args->num_byte_strides == 0) {
    if (num_bytes > 0) memcpy(buffer->data, args->data, num_bytes);
  } else {
    gather_strided(buffer->data, args->data, args->dims, args->byte_strides, args->num_dims, esize, num_elements);
  }

  /* The data was copied during the call: the host buffer is free right now. */
  PJRT_Event* done = stub_event_ready(NULL);
  if (done == NULL) {
    buffer_free(buffer);
    return stub_error(PJRT_Error_Code_RESOURCE_EXHAUSTED, "stub_neuron: out of memory");
  }
  atomic_fetch_add(&args->client->refs, 1);
  buffer->client = args->client;
  args->buffer = buffer;
  args->done_with_host_buffer = done;
  return NULL;
}

#define STUB_CHECK_BUFFER(args, field, sname) STUB_CHECK_ARGS_OBJECT(args, sname, field, STUB_MAGIC_BUFFER, "buffer")

static PJRT_Error* deleted_error(const char* function) {
  return stub_error(PJRT_Error_Code_FAILED_PRECONDITION, "%s: the buffer has been deleted", function);
}

PJRT_Error* StubBuffer_Destroy(PJRT_Buffer_Destroy_Args* args) {
  STUB_CHECK_ARGS(args, PJRT_Buffer_Destroy_Args);
  if (args->buffer == NULL) return NULL;
  PJRT_Error* error = stub_check_object(args->buffer, STUB_MAGIC_BUFFER, "buffer", "PJRT_Buffer_Destroy");
  if (error != NULL) return error;
  buffer_free(args->buffer);
  return NULL;
}

PJRT_Error* StubBuffer_ElementType(PJRT_Buffer_ElementType_Args* args) {
  STUB_CHECK_BUFFER(args, buffer, PJRT_Buffer_ElementType);
  args->type = args->buffer->type;
  return NULL;
}

PJRT_Error* StubBuffer_Dimensions(PJRT_Buffer_Dimensions_Args* args) {
  STUB_CHECK_BUFFER(args, buffer, PJRT_Buffer_Dimensions);
  args->dims = args->buffer->dims;
  args->num_dims = args->buffer->num_dims;
  return NULL;
}

PJRT_Error* StubBuffer_OnDeviceSizeInBytes(PJRT_Buffer_OnDeviceSizeInBytes_Args* args) {
  STUB_CHECK_BUFFER(args, buffer, PJRT_Buffer_OnDeviceSizeInBytes);
  PJRT_Buffer* buffer = args->buffer;
  pthread_mutex_lock(&buffer->mu);
  bool deleted = buffer->deleted;
  pthread_mutex_unlock(&buffer->mu);
  if (deleted) return deleted_error("PJRT_Buffer_OnDeviceSizeInBytes");
  args->on_device_size_in_bytes = buffer->num_bytes;
  return NULL;
}

PJRT_Error* StubBuffer_Device(PJRT_Buffer_Device_Args* args) {
  STUB_CHECK_BUFFER(args, buffer, PJRT_Buffer_Device);
  args->device = args->buffer->device;
  return NULL;
}

PJRT_Error* StubBuffer_Memory(PJRT_Buffer_Memory_Args* args) {
  STUB_CHECK_BUFFER(args, buffer, PJRT_Buffer_Memory);
  args->memory = args->buffer->device->memory;
  return NULL;
}

PJRT_Error* StubBuffer_Delete(PJRT_Buffer_Delete_Args* args) {
  STUB_CHECK_BUFFER(args, buffer, PJRT_Buffer_Delete);
  PJRT_Buffer* buffer = args->buffer;
  pthread_mutex_lock(&buffer->mu);
  free(buffer->data);
  buffer->data = NULL;
  buffer->deleted = true;
  pthread_mutex_unlock(&buffer->mu);
  return NULL;
}

PJRT_Error* StubBuffer_IsDeleted(PJRT_Buffer_IsDeleted_Args* args) {
  STUB_CHECK_BUFFER(args, buffer, PJRT_Buffer_IsDeleted);
  pthread_mutex_lock(&args->buffer->mu);
  args->is_deleted = args->buffer->deleted;
  pthread_mutex_unlock(&args->buffer->mu);
  return NULL;
}

PJRT_Error* StubBuffer_ToHostBuffer(PJRT_Buffer_ToHostBuffer_Args* args) {
  STUB_CHECK_BUFFER(args, src, PJRT_Buffer_ToHostBuffer);
  PJRT_Buffer* buffer = args->src;
  args->event = NULL;
  PJRT_Error* error = check_dense_layout(args->host_layout, buffer->num_dims, buffer->dims, buffer->element_size,
                                         "PJRT_Buffer_ToHostBuffer (host_layout)");
  if (error != NULL) return error;
  if (args->dst == NULL) { /* size query */
    args->dst_size = buffer->num_bytes;
    return NULL;
  }
  if (args->dst_size < buffer->num_bytes) {
    return stub_error(PJRT_Error_Code_INVALID_ARGUMENT,
                      "PJRT_Buffer_ToHostBuffer: dst_size is %zu bytes but the buffer needs %zu", args->dst_size,
                      buffer->num_bytes);
  }
  pthread_mutex_lock(&buffer->mu);
  bool deleted = buffer->deleted;
  if (!deleted && buffer->num_bytes > 0) memcpy(args->dst, buffer->data, buffer->num_bytes);
  pthread_mutex_unlock(&buffer->mu);
  if (deleted) return deleted_error("PJRT_Buffer_ToHostBuffer");
  args->event = stub_event_ready(NULL);
  if (args->event == NULL) return stub_error(PJRT_Error_Code_RESOURCE_EXHAUSTED, "stub_neuron: out of memory");
  return NULL;
}

PJRT_Error* StubBuffer_ReadyEvent(PJRT_Buffer_ReadyEvent_Args* args) {
  STUB_CHECK_BUFFER(args, buffer, PJRT_Buffer_ReadyEvent);
  pthread_mutex_lock(&args->buffer->mu);
  bool deleted = args->buffer->deleted;
  pthread_mutex_unlock(&args->buffer->mu);
  args->event = stub_event_ready(deleted ? deleted_error("PJRT_Buffer_ReadyEvent") : NULL);
  if (args->event == NULL) return stub_error(PJRT_Error_Code_RESOURCE_EXHAUSTED, "stub_neuron: out of memory");
  return NULL;
}

/* Buffers are never padded and have no dynamic dimensions: the unpadded dims are the dims. */
PJRT_Error* StubBuffer_UnpaddedDimensions(PJRT_Buffer_UnpaddedDimensions_Args* args) {
  STUB_CHECK_BUFFER(args, buffer, PJRT_Buffer_UnpaddedDimensions);
  args->unpadded_dims = args->buffer->dims;
  args->num_dims = args->buffer->num_dims;
  return NULL;
}

PJRT_Error* StubBuffer_DynamicDimensionIndices(PJRT_Buffer_DynamicDimensionIndices_Args* args) {
  STUB_CHECK_BUFFER(args, buffer, PJRT_Buffer_DynamicDimensionIndices);
  args->dynamic_dim_indices = NULL;
  args->num_dynamic_dims = 0;
  return NULL;
}

/* Always the default layout: dense, major-to-minor, no tiles. */
PJRT_Error* StubBuffer_GetMemoryLayout(PJRT_Buffer_GetMemoryLayout_Args* args) {
  STUB_CHECK_BUFFER(args, buffer, PJRT_Buffer_GetMemoryLayout);
  memset(&args->layout, 0, sizeof(args->layout));
  args->layout.struct_size = PJRT_Buffer_MemoryLayout_STRUCT_SIZE;
  args->layout.type = PJRT_Buffer_MemoryLayout_Type_Tiled;
  args->layout.tiled.struct_size = PJRT_Buffer_MemoryLayout_Tiled_STRUCT_SIZE;
  args->layout.tiled.minor_to_major = args->buffer->minor_to_major;
  args->layout.tiled.minor_to_major_size = args->buffer->num_dims;
  args->layout.tiled.num_tiles = 0;
  return NULL;
}

/* The stub's "device memory" is host memory, but it is not the caller's to
 * alias: answering false makes frameworks copy with PJRT_Buffer_ToHostBuffer
 * instead of asking for raw pointers and external reference counts. */
PJRT_Error* StubBuffer_IsOnCpu(PJRT_Buffer_IsOnCpu_Args* args) {
  STUB_CHECK_BUFFER(args, buffer, PJRT_Buffer_IsOnCpu);
  args->is_on_cpu = false;
  return NULL;
}
