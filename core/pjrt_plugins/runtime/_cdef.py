"""Our cffi declarations of the PJRT C API, laid out as the 0.117 header; the single ABI source.

Every layout fact the runtime relies on lives here: the args structs we call with, the
PJRT_Api slot order (slot i at byte 40 + 8*i) and the API minor that added each slot.
STRUCT_SIZE is derived from cffi in one place. Never write an offset anywhere else.

The header these declarations follow is XLA's ``xla/pjrt/c/pjrt_c_api.h`` at
``PJRT_API_MINOR 117``, as shipped in the tf-nightly 2.23.0.dev20261026 wheel
(``tensorflow/include/xla/pjrt/c/pjrt_c_api.h``, Apache-2.0). tests/runtime/test_abi.py
compiles it, and the 0.81 header of the xla-cpu-pjrt wheel, against these declarations.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Any, NamedTuple

import cffi

#: The major version we speak. A major bump is an ABI break.
API_MAJOR = 0
#: The newest header layout these declarations follow.
HEADER_MINOR = 117
#: The oldest plugin minor we accept. PJRT 0.57 rearranged the function slots of PJRT_Api
#: ("Rearranged fields in the PJRT_Api", changelog 0.57), so below it slot i does not hold
#: the function our table names and a call would jump into the wrong function with the
#: wrong args struct. Every args struct we use has only grown by appending since then.
MIN_SUPPORTED_MINOR = 57

# ---------------------------------------------------------------------------------------
# Types. Written for this project from the published layout (the 0.81 header shipped with
# the CPU plugin wheel, plus the fields appended up to 0.117, read in the 0.117 header named
# above). Valid C: the ABI test feeds this text to gcc as well as to cffi.
# ---------------------------------------------------------------------------------------
_TYPES = r"""
typedef enum {
  PJRT_Extension_Type_Gpu_Custom_Call = 0,
  PJRT_Extension_Type_Profiler = 1,
  PJRT_Extension_Type_Custom_Partitioner = 2,
  PJRT_Extension_Type_Stream = 3,
  PJRT_Extension_Type_Layouts = 4,
  PJRT_Extension_Type_FFI = 5,
  PJRT_Extension_Type_MemoryDescriptions = 6,
  PJRT_Extension_Type_Triton = 7,
  PJRT_Extension_Type_RawBuffer = 8,
  PJRT_Extension_Type_PhaseCompile = 9,
  PJRT_Extension_Type_Example = 10,
  PJRT_Extension_Type_Unknown = 11,
  PJRT_Extension_Type_CrossHostTransfers = 12,
  PJRT_Extension_Type_ExecutableMetadata = 13,
  PJRT_Extension_Type_Callback = 14,
  PJRT_Extension_Type_HostAllocator = 15,
  PJRT_Extension_Type_TpuTopology = 16,
  PJRT_Extension_Type_TpuExecutable = 17,
  PJRT_Extension_Type_Megascale = 18,
  PJRT_Extension_Type_Shardings = 19,
  PJRT_Extension_Type_AbiVersion = 20,
  PJRT_Extension_Type_Collectives = 21,
  PJRT_Extension_Type_MultiSlice = 22,
  PJRT_Extension_Type_HostMemoryAllocator = 23,
  PJRT_Extension_Type_XlaTransform = 24
} PJRT_Extension_Type;

typedef struct PJRT_Extension_Base {
  size_t struct_size;
  PJRT_Extension_Type type;
  struct PJRT_Extension_Base* next;
} PJRT_Extension_Base;

typedef struct PJRT_Api_Version {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  int major_version;
  int minor_version;
} PJRT_Api_Version;

typedef struct PJRT_Error PJRT_Error;
typedef struct PJRT_Event PJRT_Event;
typedef struct PJRT_Client PJRT_Client;
typedef struct PJRT_Device PJRT_Device;
typedef struct PJRT_Memory PJRT_Memory;
typedef struct PJRT_DeviceDescription PJRT_DeviceDescription;
typedef struct PJRT_Executable PJRT_Executable;
typedef struct PJRT_LoadedExecutable PJRT_LoadedExecutable;
typedef struct PJRT_Buffer PJRT_Buffer;
typedef struct PJRT_SerializedExecutable PJRT_SerializedExecutable;
typedef struct PJRT_ExecuteContext PJRT_ExecuteContext;
typedef struct PJRT_SendCallbackInfo PJRT_SendCallbackInfo;
typedef struct PJRT_RecvCallbackInfo PJRT_RecvCallbackInfo;
typedef struct PJRT_LoadOptions PJRT_LoadOptions;
typedef struct PJRT_MultiSlice_Config PJRT_MultiSlice_Config;
typedef struct PJRT_HloOutputCallbackInfo PJRT_HloOutputCallbackInfo;

typedef enum {
  PJRT_Error_Code_OK = 0,
  PJRT_Error_Code_CANCELLED = 1,
  PJRT_Error_Code_UNKNOWN = 2,
  PJRT_Error_Code_INVALID_ARGUMENT = 3,
  PJRT_Error_Code_DEADLINE_EXCEEDED = 4,
  PJRT_Error_Code_NOT_FOUND = 5,
  PJRT_Error_Code_ALREADY_EXISTS = 6,
  PJRT_Error_Code_PERMISSION_DENIED = 7,
  PJRT_Error_Code_RESOURCE_EXHAUSTED = 8,
  PJRT_Error_Code_FAILED_PRECONDITION = 9,
  PJRT_Error_Code_ABORTED = 10,
  PJRT_Error_Code_OUT_OF_RANGE = 11,
  PJRT_Error_Code_UNIMPLEMENTED = 12,
  PJRT_Error_Code_INTERNAL = 13,
  PJRT_Error_Code_UNAVAILABLE = 14,
  PJRT_Error_Code_DATA_LOSS = 15,
  PJRT_Error_Code_UNAUTHENTICATED = 16
} PJRT_Error_Code;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Error* error;
} PJRT_Error_Destroy_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const PJRT_Error* error;
  const char* message;
  size_t message_size;
} PJRT_Error_Message_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const PJRT_Error* error;
  PJRT_Error_Code code;
} PJRT_Error_GetCode_Args;

typedef PJRT_Error* (*PJRT_CallbackError)(PJRT_Error_Code code, const char* message,
                                          size_t message_size);

typedef enum {
  PJRT_NamedValue_kString = 0,
  PJRT_NamedValue_kInt64 = 1,
  PJRT_NamedValue_kInt64List = 2,
  PJRT_NamedValue_kFloat = 3,
  PJRT_NamedValue_kBool = 4
} PJRT_NamedValue_Type;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const char* name;
  size_t name_size;
  PJRT_NamedValue_Type type;
  union {
    const char* string_value;
    int64_t int64_value;
    const int64_t* int64_array_value;
    float float_value;
    bool bool_value;
  };
  size_t value_size;
} PJRT_NamedValue;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
} PJRT_Plugin_Initialize_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const PJRT_NamedValue* attributes;
  size_t num_attributes;
} PJRT_Plugin_Attributes_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Event* event;
} PJRT_Event_Destroy_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Event* event;
  bool is_ready;
} PJRT_Event_IsReady_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Event* event;
} PJRT_Event_Error_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Event* event;
} PJRT_Event_Await_Args;

typedef void (*PJRT_Event_OnReadyCallback)(PJRT_Error* error, void* user_arg);

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Event* event;
  PJRT_Event_OnReadyCallback callback;
  void* user_arg;
} PJRT_Event_OnReady_Args;

typedef void (*PJRT_KeyValueGetCallback_ValueDeleter)(char* value);

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const char* key;
  size_t key_size;
  int timeout_in_ms;
  PJRT_CallbackError* callback_error;
  void* user_arg;
  char* value;
  size_t value_size;
  PJRT_KeyValueGetCallback_ValueDeleter value_deleter_callback;
} PJRT_KeyValueGetCallback_Args;

typedef PJRT_Error* (*PJRT_KeyValueGetCallback)(PJRT_KeyValueGetCallback_Args* args);

typedef void (*PJRT_KeyValueTryGetCallback_ValueDeleter)(char* value);

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const char* key;
  size_t key_size;
  PJRT_CallbackError* callback_error;
  void* user_arg;
  char* value;
  size_t value_size;
  PJRT_KeyValueTryGetCallback_ValueDeleter value_deleter_callback;
} PJRT_KeyValueTryGetCallback_Args;

typedef PJRT_Error* (*PJRT_KeyValueTryGetCallback)(PJRT_KeyValueTryGetCallback_Args* args);

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const char* key;
  size_t key_size;
  const char* value;
  size_t value_size;
  PJRT_CallbackError* callback_error;
  void* user_arg;
} PJRT_KeyValuePutCallback_Args;

typedef PJRT_Error* (*PJRT_KeyValuePutCallback)(PJRT_KeyValuePutCallback_Args* args);

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const PJRT_NamedValue* create_options;
  size_t num_options;
  PJRT_KeyValueGetCallback kv_get_callback;
  void* kv_get_user_arg;
  PJRT_KeyValuePutCallback kv_put_callback;
  void* kv_put_user_arg;
  PJRT_Client* client;
  PJRT_KeyValueTryGetCallback kv_try_get_callback;
  void* kv_try_get_user_arg;
} PJRT_Client_Create_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
} PJRT_Client_Destroy_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  const char* platform_name;
  size_t platform_name_size;
} PJRT_Client_PlatformName_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  int process_index;
} PJRT_Client_ProcessIndex_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  const char* platform_version;
  size_t platform_version_size;
} PJRT_Client_PlatformVersion_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  PJRT_Device* const* devices;
  size_t num_devices;
} PJRT_Client_Devices_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  PJRT_Device* const* addressable_devices;
  size_t num_addressable_devices;
} PJRT_Client_AddressableDevices_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  int id;
  PJRT_Device* device;
} PJRT_Client_LookupDevice_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  int local_hardware_id;
  PJRT_Device* addressable_device;
} PJRT_Client_LookupAddressableDevice_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  PJRT_Memory* const* addressable_memories;
  size_t num_addressable_memories;
} PJRT_Client_AddressableMemories_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  char* code;
  size_t code_size;
  const char* format;
  size_t format_size;
} PJRT_Program;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  const PJRT_Program* program;
  const char* compile_options;
  size_t compile_options_size;
  PJRT_LoadedExecutable* executable;
} PJRT_Client_Compile_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  int num_replicas;
  int num_partitions;
  size_t default_assignment_size;
  int* default_assignment;
} PJRT_Client_DefaultDeviceAssignment_Args;

typedef enum {
  PJRT_Buffer_Type_INVALID = 0,
  PJRT_Buffer_Type_PRED = 1,
  PJRT_Buffer_Type_S8 = 2,
  PJRT_Buffer_Type_S16 = 3,
  PJRT_Buffer_Type_S32 = 4,
  PJRT_Buffer_Type_S64 = 5,
  PJRT_Buffer_Type_U8 = 6,
  PJRT_Buffer_Type_U16 = 7,
  PJRT_Buffer_Type_U32 = 8,
  PJRT_Buffer_Type_U64 = 9,
  PJRT_Buffer_Type_F16 = 10,
  PJRT_Buffer_Type_F32 = 11,
  PJRT_Buffer_Type_F64 = 12,
  PJRT_Buffer_Type_BF16 = 13,
  PJRT_Buffer_Type_C64 = 14,
  PJRT_Buffer_Type_C128 = 15,
  PJRT_Buffer_Type_F8E5M2 = 16,
  PJRT_Buffer_Type_F8E4M3FN = 17,
  PJRT_Buffer_Type_F8E4M3B11FNUZ = 18,
  PJRT_Buffer_Type_F8E5M2FNUZ = 19,
  PJRT_Buffer_Type_F8E4M3FNUZ = 20,
  PJRT_Buffer_Type_S4 = 21,
  PJRT_Buffer_Type_U4 = 22,
  PJRT_Buffer_Type_TOKEN = 23,
  PJRT_Buffer_Type_S2 = 24,
  PJRT_Buffer_Type_U2 = 25,
  PJRT_Buffer_Type_F8E4M3 = 26,
  PJRT_Buffer_Type_F8E3M4 = 27,
  PJRT_Buffer_Type_F8E8M0FNU = 28,
  PJRT_Buffer_Type_F4E2M1FN = 29,
  PJRT_Buffer_Type_S1 = 30,
  PJRT_Buffer_Type_U1 = 31,
  PJRT_Buffer_Type_F6E2M3FN = 32,
  PJRT_Buffer_Type_F6E3M2FN = 33
} PJRT_Buffer_Type;

typedef enum {
  PJRT_HostBufferSemantics_kImmutableOnlyDuringCall = 0,
  PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes = 1,
  PJRT_HostBufferSemantics_kImmutableZeroCopy = 2,
  PJRT_HostBufferSemantics_kMutableZeroCopy = 3
} PJRT_HostBufferSemantics;

typedef enum {
  PJRT_Buffer_MemoryLayout_Type_Tiled = 0,
  PJRT_Buffer_MemoryLayout_Type_Strides = 1
} PJRT_Buffer_MemoryLayout_Type;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const int64_t* minor_to_major;
  size_t minor_to_major_size;
  const int64_t* tile_dims;
  const size_t* tile_dim_sizes;
  size_t num_tiles;
} PJRT_Buffer_MemoryLayout_Tiled;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const int64_t* byte_strides;
  size_t num_byte_strides;
} PJRT_Buffer_MemoryLayout_Strides;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  union {
    PJRT_Buffer_MemoryLayout_Tiled tiled;
    PJRT_Buffer_MemoryLayout_Strides strides;
  };
  PJRT_Buffer_MemoryLayout_Type type;
} PJRT_Buffer_MemoryLayout;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  const void* data;
  PJRT_Buffer_Type type;
  const int64_t* dims;
  size_t num_dims;
  const int64_t* byte_strides;
  size_t num_byte_strides;
  PJRT_HostBufferSemantics host_buffer_semantics;
  PJRT_Device* device;
  PJRT_Memory* memory;
  PJRT_Buffer_MemoryLayout* device_layout;
  PJRT_Event* done_with_host_buffer;
  PJRT_Buffer* buffer;
} PJRT_Client_BufferFromHostBuffer_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_DeviceDescription* device_description;
  int id;
} PJRT_DeviceDescription_Id_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_DeviceDescription* device_description;
  int process_index;
} PJRT_DeviceDescription_ProcessIndex_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_DeviceDescription* device_description;
  size_t num_attributes;
  const PJRT_NamedValue* attributes;
} PJRT_DeviceDescription_Attributes_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_DeviceDescription* device_description;
  const char* device_kind;
  size_t device_kind_size;
} PJRT_DeviceDescription_Kind_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_DeviceDescription* device_description;
  const char* debug_string;
  size_t debug_string_size;
} PJRT_DeviceDescription_DebugString_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_DeviceDescription* device_description;
  const char* to_string;
  size_t to_string_size;
} PJRT_DeviceDescription_ToString_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Device* device;
  PJRT_DeviceDescription* device_description;
} PJRT_Device_GetDescription_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Device* device;
  bool is_addressable;
} PJRT_Device_IsAddressable_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Device* device;
  int local_hardware_id;
} PJRT_Device_LocalHardwareId_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Device* device;
  PJRT_Memory* const* memories;
  size_t num_memories;
} PJRT_Device_AddressableMemories_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Device* device;
  PJRT_Memory* memory;
} PJRT_Device_DefaultMemory_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Memory* memory;
  int id;
} PJRT_Memory_Id_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Memory* memory;
  const char* kind;
  size_t kind_size;
} PJRT_Memory_Kind_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Memory* memory;
  int kind_id;
} PJRT_Memory_Kind_Id_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Memory* memory;
  const char* debug_string;
  size_t debug_string_size;
} PJRT_Memory_DebugString_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Memory* memory;
  const char* to_string;
  size_t to_string_size;
} PJRT_Memory_ToString_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Memory* memory;
  PJRT_Device* const* devices;
  size_t num_devices;
} PJRT_Memory_AddressableByDevices_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
} PJRT_Executable_Destroy_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_LoadedExecutable* executable;
} PJRT_LoadedExecutable_Destroy_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_LoadedExecutable* loaded_executable;
  PJRT_Executable* executable;
} PJRT_LoadedExecutable_GetExecutable_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
  const char* executable_name;
  size_t executable_name_size;
} PJRT_Executable_Name_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
  size_t num_replicas;
} PJRT_Executable_NumReplicas_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
  size_t num_partitions;
} PJRT_Executable_NumPartitions_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_LoadedExecutable* executable;
  PJRT_Device* const* addressable_devices;
  size_t num_addressable_devices;
} PJRT_LoadedExecutable_AddressableDevices_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
  PJRT_Program* program;
} PJRT_Executable_OptimizedProgram_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_LoadedExecutable* executable;
} PJRT_LoadedExecutable_Delete_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_LoadedExecutable* executable;
  bool is_deleted;
} PJRT_LoadedExecutable_IsDeleted_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_SendCallbackInfo** send_callbacks;
  PJRT_RecvCallbackInfo** recv_callbacks;
  size_t num_send_ops;
  size_t num_recv_ops;
  int launch_id;
  const int64_t* non_donatable_input_indices;
  size_t num_non_donatable_input_indices;
  PJRT_ExecuteContext* context;
  const char* call_location;
  size_t num_tasks;
  int* task_ids;
  int64_t* incarnation_ids;
  PJRT_MultiSlice_Config* multi_slice_config;
  bool use_major_to_minor_data_layout_for_callbacks;
  PJRT_HloOutputCallbackInfo* hlo_output_callbacks;
  size_t num_hlo_output_callbacks;
  const PJRT_NamedValue* custom_options;
  size_t num_custom_options;
} PJRT_ExecuteOptions;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_LoadedExecutable* executable;
  PJRT_ExecuteOptions* options;
  PJRT_Buffer* const* const* argument_lists;
  size_t num_devices;
  size_t num_args;
  PJRT_Buffer** const* output_lists;
  PJRT_Event** device_complete_events;
  PJRT_Device* execute_device;
} PJRT_LoadedExecutable_Execute_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
  size_t num_outputs;
} PJRT_Executable_NumOutputs_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
  int64_t size_in_bytes;
} PJRT_Executable_SizeOfGeneratedCodeInBytes_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
  const char* executable_fingerprint;
  size_t executable_fingerprint_size;
} PJRT_Executable_Fingerprint_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
  size_t num_properties;
  const PJRT_NamedValue* properties;
} PJRT_Executable_GetCostAnalysis_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
  PJRT_Buffer_Type* output_types;
  size_t num_output_types;
} PJRT_Executable_OutputElementTypes_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
  size_t num_outputs;
  const int64_t* dims;
  const size_t* dim_sizes;
} PJRT_Executable_OutputDimensions_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
  size_t num_outputs;
  const char* const* memory_kinds;
  const size_t* memory_kind_sizes;
} PJRT_Executable_OutputMemoryKinds_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const PJRT_Executable* executable;
  const char* serialized_bytes;
  size_t serialized_bytes_size;
  PJRT_SerializedExecutable* serialized_executable;
  void (*serialized_executable_deleter)(PJRT_SerializedExecutable* exec);
} PJRT_Executable_Serialize_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  const char* serialized_executable;
  size_t serialized_executable_size;
  PJRT_LoadedExecutable* loaded_executable;
  const char* overridden_serialized_compile_options;
  size_t overridden_serialized_compile_options_size;
  const PJRT_LoadOptions* load_options;
} PJRT_Executable_DeserializeAndLoad_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_LoadedExecutable* executable;
  const char* executable_fingerprint;
  size_t executable_fingerprint_size;
} PJRT_LoadedExecutable_Fingerprint_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
} PJRT_Buffer_Destroy_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  PJRT_Buffer_Type type;
} PJRT_Buffer_ElementType_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  const int64_t* dims;
  size_t num_dims;
} PJRT_Buffer_Dimensions_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  const int64_t* unpadded_dims;
  size_t num_dims;
} PJRT_Buffer_UnpaddedDimensions_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* src;
  PJRT_Buffer_MemoryLayout* host_layout;
  void* dst;
  size_t dst_size;
  PJRT_Event* event;
} PJRT_Buffer_ToHostBuffer_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  size_t on_device_size_in_bytes;
} PJRT_Buffer_OnDeviceSizeInBytes_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
} PJRT_Buffer_Delete_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  bool is_deleted;
} PJRT_Buffer_IsDeleted_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  PJRT_Device* dst_device;
  PJRT_Buffer* dst_buffer;
} PJRT_Buffer_CopyToDevice_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  bool is_on_cpu;
} PJRT_Buffer_IsOnCpu_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  PJRT_Device* device;
} PJRT_Buffer_Device_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  PJRT_Memory* memory;
} PJRT_Buffer_Memory_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  PJRT_Event* event;
} PJRT_Buffer_ReadyEvent_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  PJRT_Buffer_MemoryLayout layout;
} PJRT_Buffer_GetMemoryLayout_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
} PJRT_Buffer_IncreaseExternalReferenceCount_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
} PJRT_Buffer_DecreaseExternalReferenceCount_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  void* device_memory_ptr;
} PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args;

typedef struct {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  void* dst;
  int64_t offset;
  int64_t transfer_size;
  PJRT_Event* event;
} PJRT_Buffer_CopyRawToHost_Args;

typedef PJRT_Error* PJRT_UntypedFunction(void* args);
"""

# ---------------------------------------------------------------------------------------
# Device memory statistics, memory descriptions and the profiler (used by _memory and
# _profiler). Kept in one block of their own; written for this project from the published
# layouts: PJRT_Device_MemoryStats_Args from pjrt_c_api.h (as in the 0.117 header), the
# MemoryDescriptions extension (pjrt_c_api_memory_descriptions_extension.h, version 1), the
# Profiler extension (pjrt_c_api_profiler_extension.h, version 1) and the plugin profiler API
# it points to (xla/backends/profiler/plugin/profiler_c_api.h, PLUGIN_PROFILER_VERSION 1).
# PJRT_Api's PJRT_Device_MemoryStats slot stays untyped; _memory casts it to
# PJRT_Device_MemoryStats_Fn.
# ---------------------------------------------------------------------------------------
_EXTENSION_TYPES = r"""
typedef struct PJRT_Device_MemoryStats_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Device* device;
  int64_t bytes_in_use;
  int64_t peak_bytes_in_use;
  bool peak_bytes_in_use_is_set;
  int64_t num_allocs;
  bool num_allocs_is_set;
  int64_t largest_alloc_size;
  bool largest_alloc_size_is_set;
  int64_t bytes_limit;
  bool bytes_limit_is_set;
  int64_t bytes_reserved;
  bool bytes_reserved_is_set;
  int64_t peak_bytes_reserved;
  bool peak_bytes_reserved_is_set;
  int64_t bytes_reservable_limit;
  bool bytes_reservable_limit_is_set;
  int64_t largest_free_block_bytes;
  bool largest_free_block_bytes_is_set;
  int64_t pool_bytes;
  bool pool_bytes_is_set;
  int64_t peak_pool_bytes;
  bool peak_pool_bytes_is_set;
  int64_t peak_allocated_bytes;
  bool peak_allocated_bytes_is_set;
} PJRT_Device_MemoryStats_Args;
typedef PJRT_Error* PJRT_Device_MemoryStats_Fn(PJRT_Device_MemoryStats_Args* args);

typedef struct PJRT_MemoryDescription PJRT_MemoryDescription;

typedef struct PJRT_DeviceDescription_MemoryDescriptions_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_DeviceDescription* device_description;
  const PJRT_MemoryDescription* const* memory_descriptions;
  size_t num_memory_descriptions;
  size_t default_memory_index;
} PJRT_DeviceDescription_MemoryDescriptions_Args;

typedef struct PJRT_MemoryDescription_Kind_Args {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const PJRT_MemoryDescription* memory_description;
  const char* kind;
  size_t kind_size;
  int kind_id;
} PJRT_MemoryDescription_Kind_Args;

typedef struct PJRT_MemoryDescriptions_Extension {
  size_t struct_size;  /* PJRT_Extension_Base, spelled out */
  PJRT_Extension_Type type;
  PJRT_Extension_Base* next;
  PJRT_Error* (*PJRT_DeviceDescription_MemoryDescriptions)(PJRT_DeviceDescription_MemoryDescriptions_Args* args);
  PJRT_Error* (*PJRT_MemoryDescription_Kind)(PJRT_MemoryDescription_Kind_Args* args);
} PJRT_MemoryDescriptions_Extension;

typedef struct PLUGIN_Profiler PLUGIN_Profiler;
typedef struct PLUGIN_Profiler_Error PLUGIN_Profiler_Error;

typedef struct PLUGIN_Profiler_Error_Destroy_Args {
  size_t struct_size;
  void* priv;
  PLUGIN_Profiler_Error* error;
} PLUGIN_Profiler_Error_Destroy_Args;

typedef struct PLUGIN_Profiler_Error_Message_Args {
  size_t struct_size;
  void* priv;
  const PLUGIN_Profiler_Error* error;
  const char* message;
  size_t message_size;
} PLUGIN_Profiler_Error_Message_Args;

typedef struct PLUGIN_Profiler_Error_GetCode_Args {
  size_t struct_size;
  void* priv;
  const PLUGIN_Profiler_Error* error;
  int code;
} PLUGIN_Profiler_Error_GetCode_Args;

typedef struct PLUGIN_Profiler_Create_Args {
  size_t struct_size;
  const char* options;
  size_t options_size;
  PLUGIN_Profiler* profiler;
} PLUGIN_Profiler_Create_Args;

typedef struct PLUGIN_Profiler_Destroy_Args {
  size_t struct_size;
  PLUGIN_Profiler* profiler;
} PLUGIN_Profiler_Destroy_Args;

typedef struct PLUGIN_Profiler_Start_Args {
  size_t struct_size;
  PLUGIN_Profiler* profiler;
} PLUGIN_Profiler_Start_Args;

typedef struct PLUGIN_Profiler_Stop_Args {
  size_t struct_size;
  PLUGIN_Profiler* profiler;
} PLUGIN_Profiler_Stop_Args;

typedef struct PLUGIN_Profiler_CollectData_Args {
  size_t struct_size;
  PLUGIN_Profiler* profiler;
  uint8_t* buffer;
  size_t buffer_size_in_bytes;
} PLUGIN_Profiler_CollectData_Args;

typedef struct PLUGIN_Profiler_Api {
  size_t struct_size;
  void* priv;
  void (*error_destroy)(PLUGIN_Profiler_Error_Destroy_Args* args);
  void (*error_message)(PLUGIN_Profiler_Error_Message_Args* args);
  PLUGIN_Profiler_Error* (*error_get_code)(PLUGIN_Profiler_Error_GetCode_Args* args);
  PLUGIN_Profiler_Error* (*create)(PLUGIN_Profiler_Create_Args* args);
  PLUGIN_Profiler_Error* (*destroy)(PLUGIN_Profiler_Destroy_Args* args);
  PLUGIN_Profiler_Error* (*start)(PLUGIN_Profiler_Start_Args* args);
  PLUGIN_Profiler_Error* (*stop)(PLUGIN_Profiler_Stop_Args* args);
  PLUGIN_Profiler_Error* (*collect_data)(PLUGIN_Profiler_CollectData_Args* args);
} PLUGIN_Profiler_Api;

typedef struct PJRT_Profiler_Extension {
  size_t struct_size;  /* PJRT_Extension_Base, spelled out */
  PJRT_Extension_Type type;
  PJRT_Extension_Base* next;
  PLUGIN_Profiler_Api* profiler_api;
  int64_t traceme_context_id;
} PJRT_Profiler_Extension;
"""


class Slot(NamedTuple):
    """One function pointer of PJRT_Api: its name, the args struct we call it with, and
    the API minor that added it (for error messages)."""

    name: str
    args: str | None
    added: int


def _called(name: str, added: int = MIN_SUPPORTED_MINOR) -> Slot:
    """A slot the runtime calls, with its args struct ``{name}_Args``. ``added`` defaults to
    MIN_SUPPORTED_MINOR: the slot is in every plugin we accept."""
    return Slot(name, f"{name}_Args", added)


def _uncalled(name: str, added: int = MIN_SUPPORTED_MINOR) -> Slot:
    """A slot the runtime never calls: declared untyped (``args is None``), still gated."""
    return Slot(name, None, added)


#: The newest minor that can have added a slot or field the changelog we could read (it stops
#: at 0.105) does not mention: the oldest layout we read that has it. Such entries are upper
#: bounds (reported as "by 0.N").
_IN_LAYOUT_0_114 = 114
_IN_LAYOUT_0_117 = 117


#: PJRT_Api's function-pointer slots in declaration order: slot i lives at 40 + 8*i.
#: ``args is None`` marks a slot we never call (declared untyped, still gated).
API_SLOTS: tuple[Slot, ...] = (
    _called("PJRT_Error_Destroy"),
    _called("PJRT_Error_Message"),
    _called("PJRT_Error_GetCode"),
    _called("PJRT_Plugin_Initialize"),
    _called("PJRT_Plugin_Attributes"),
    _called("PJRT_Event_Destroy"),
    _called("PJRT_Event_IsReady"),
    _called("PJRT_Event_Error"),
    _called("PJRT_Event_Await"),
    _called("PJRT_Event_OnReady"),
    _called("PJRT_Client_Create"),
    _called("PJRT_Client_Destroy"),
    _called("PJRT_Client_PlatformName"),
    _called("PJRT_Client_ProcessIndex"),
    _called("PJRT_Client_PlatformVersion"),
    _called("PJRT_Client_Devices"),
    _called("PJRT_Client_AddressableDevices"),
    _called("PJRT_Client_LookupDevice"),
    _called("PJRT_Client_LookupAddressableDevice"),
    _called("PJRT_Client_AddressableMemories"),
    _called("PJRT_Client_Compile"),
    _called("PJRT_Client_DefaultDeviceAssignment"),
    _called("PJRT_Client_BufferFromHostBuffer"),
    _called("PJRT_DeviceDescription_Id"),
    _called("PJRT_DeviceDescription_ProcessIndex"),
    _called("PJRT_DeviceDescription_Attributes"),
    _called("PJRT_DeviceDescription_Kind"),
    _called("PJRT_DeviceDescription_DebugString"),
    _called("PJRT_DeviceDescription_ToString"),
    _called("PJRT_Device_GetDescription"),
    _called("PJRT_Device_IsAddressable"),
    _called("PJRT_Device_LocalHardwareId"),
    _called("PJRT_Device_AddressableMemories"),
    _called("PJRT_Device_DefaultMemory"),
    _uncalled("PJRT_Device_MemoryStats"),
    _called("PJRT_Memory_Id"),
    _called("PJRT_Memory_Kind"),
    _called("PJRT_Memory_DebugString"),
    _called("PJRT_Memory_ToString"),
    _called("PJRT_Memory_AddressableByDevices"),
    _called("PJRT_Executable_Destroy"),
    _called("PJRT_Executable_Name"),
    _called("PJRT_Executable_NumReplicas"),
    _called("PJRT_Executable_NumPartitions"),
    _called("PJRT_Executable_NumOutputs"),
    _called("PJRT_Executable_SizeOfGeneratedCodeInBytes"),
    _called("PJRT_Executable_GetCostAnalysis"),
    _called("PJRT_Executable_OutputMemoryKinds"),
    _called("PJRT_Executable_OptimizedProgram"),
    _called("PJRT_Executable_Serialize"),
    _called("PJRT_LoadedExecutable_Destroy"),
    _called("PJRT_LoadedExecutable_GetExecutable"),
    _called("PJRT_LoadedExecutable_AddressableDevices"),
    _called("PJRT_LoadedExecutable_Delete"),
    _called("PJRT_LoadedExecutable_IsDeleted"),
    _called("PJRT_LoadedExecutable_Execute"),
    _called("PJRT_Executable_DeserializeAndLoad"),
    _called("PJRT_LoadedExecutable_Fingerprint"),
    _called("PJRT_Buffer_Destroy"),
    _called("PJRT_Buffer_ElementType"),
    _called("PJRT_Buffer_Dimensions"),
    _called("PJRT_Buffer_UnpaddedDimensions"),
    _uncalled("PJRT_Buffer_DynamicDimensionIndices"),
    _called("PJRT_Buffer_GetMemoryLayout"),
    _called("PJRT_Buffer_OnDeviceSizeInBytes"),
    _called("PJRT_Buffer_Device"),
    _called("PJRT_Buffer_Memory"),
    _called("PJRT_Buffer_Delete"),
    _called("PJRT_Buffer_IsDeleted"),
    _called("PJRT_Buffer_CopyToDevice"),
    _called("PJRT_Buffer_ToHostBuffer"),
    _called("PJRT_Buffer_IsOnCpu"),
    _called("PJRT_Buffer_ReadyEvent"),
    _uncalled("PJRT_Buffer_UnsafePointer"),
    _called("PJRT_Buffer_IncreaseExternalReferenceCount"),
    _called("PJRT_Buffer_DecreaseExternalReferenceCount"),
    _called("PJRT_Buffer_OpaqueDeviceMemoryDataPointer"),
    _uncalled("PJRT_CopyToDeviceStream_Destroy"),
    _uncalled("PJRT_CopyToDeviceStream_AddChunk"),
    _uncalled("PJRT_CopyToDeviceStream_TotalBytes"),
    _uncalled("PJRT_CopyToDeviceStream_GranuleSize"),
    _uncalled("PJRT_CopyToDeviceStream_CurrentBytes"),
    _uncalled("PJRT_TopologyDescription_Create"),
    _uncalled("PJRT_TopologyDescription_Destroy"),
    _uncalled("PJRT_TopologyDescription_PlatformName"),
    _uncalled("PJRT_TopologyDescription_PlatformVersion"),
    _uncalled("PJRT_TopologyDescription_GetDeviceDescriptions"),
    _uncalled("PJRT_TopologyDescription_Serialize"),
    _uncalled("PJRT_TopologyDescription_Attributes"),
    _uncalled("PJRT_Compile"),
    # Appended after the original table (changelog minors; all below 0.57 are present in
    # every plugin we accept, so they carry MIN_SUPPORTED_MINOR).
    _called("PJRT_Executable_OutputElementTypes"),
    _called("PJRT_Executable_OutputDimensions"),
    _uncalled("PJRT_Buffer_CopyToMemory"),
    _uncalled("PJRT_Client_CreateViewOfDeviceBuffer"),
    _called("PJRT_Executable_Fingerprint"),
    _uncalled("PJRT_Client_TopologyDescription"),
    _uncalled("PJRT_Executable_GetCompiledMemoryStats"),
    _called("PJRT_Memory_Kind_Id"),
    _uncalled("PJRT_ExecuteContext_Create"),
    _uncalled("PJRT_ExecuteContext_Destroy"),
    _called("PJRT_Buffer_CopyRawToHost"),
    _uncalled("PJRT_AsyncHostToDeviceTransferManager_Destroy"),
    _uncalled("PJRT_AsyncHostToDeviceTransferManager_TransferData"),
    _uncalled("PJRT_Client_CreateBuffersForAsyncHostToDevice", 60),
    _uncalled("PJRT_AsyncHostToDeviceTransferManager_RetrieveBuffer", 62),
    _uncalled("PJRT_AsyncHostToDeviceTransferManager_Device", 62),
    _uncalled("PJRT_AsyncHostToDeviceTransferManager_BufferCount", 62),
    _uncalled("PJRT_AsyncHostToDeviceTransferManager_BufferSize", 62),
    _uncalled("PJRT_AsyncHostToDeviceTransferManager_SetBufferError", 62),
    _uncalled("PJRT_AsyncHostToDeviceTransferManager_AddMetadata", 62),
    _uncalled("PJRT_Client_DmaMap", 67),
    _uncalled("PJRT_Client_DmaUnmap", 67),
    _uncalled("PJRT_Client_CreateUninitializedBuffer", 69),
    _uncalled("PJRT_Client_UpdateGlobalProcessInfo", 73),
    _uncalled("PJRT_TopologyDescription_Deserialize", 75),
    _uncalled("PJRT_Client_CreateAliasBuffer", 77),
    _uncalled("PJRT_Client_FulfillAliasBuffer", 77),
    _uncalled("PJRT_LoadedExecutable_GetDeviceAssignment", 79),
    _uncalled("PJRT_Client_CreateErrorBuffer", 82),
    _uncalled("PJRT_AsyncHostToDeviceTransferManager_TransferLiteral", 83),
    _uncalled("PJRT_Buffer_CopyRawToHostFuture", 84),
    _uncalled("PJRT_Device_PoisonExecution", 85),
    _uncalled("PJRT_Device_CreateAsyncTrackingEvent", 86),
    _uncalled("PJRT_AsyncTrackingEvent_Destroy", 86),
    _uncalled("PJRT_Executable_GetCompileOptions", 87),
    _uncalled("PJRT_Buffer_DonateWithControlDependency", 88),
    _uncalled("PJRT_Event_Create", 89),
    _uncalled("PJRT_Event_Set", 89),
    _uncalled("PJRT_Device_GetAttributes", 92),
    _uncalled("PJRT_Client_Load", 95),
    _uncalled("PJRT_LoadedExecutable_AddressableDeviceLogicalIds", 96),
    _uncalled("PJRT_Buffer_Bitcast", 98),
    _uncalled("PJRT_Error_ForEachPayload", 99),
    _uncalled("PJRT_TopologyDescription_Fingerprint", 101),
    _uncalled("PJRT_Executable_ParameterMemoryKinds", 102),
    _uncalled("PJRT_Device_ClearMemoryStats", 106),
    # Not in the changelog we could read, but in the 0.114 layout: added by 0.114.
    _uncalled("PJRT_TopologyDescription_MakeCanonicalShapeForMemorySpace", _IN_LAYOUT_0_114),
    _uncalled("PJRT_TopologyDescription_GetMemorySpaceKindIds", _IN_LAYOUT_0_114),
)

#: Slots whose exact introducing minor is unknown (only an upper bound is).
ADDED_BY_AT_LATEST = frozenset(
    {"PJRT_TopologyDescription_MakeCanonicalShapeForMemorySpace", "PJRT_TopologyDescription_GetMemorySpaceKindIds"}
)

#: Args-struct fields appended after the 0.81 header (the one the ABI test compiles), with the
#: minor that added them (an upper bound where the changelog is silent).
FIELDS_ADDED_AFTER_0_81: dict[tuple[str, str], int] = {
    ("PJRT_ExecuteOptions", "multi_slice_config"): 97,
    ("PJRT_ExecuteOptions", "use_major_to_minor_data_layout_for_callbacks"): _IN_LAYOUT_0_114,
    ("PJRT_ExecuteOptions", "hlo_output_callbacks"): _IN_LAYOUT_0_114,
    ("PJRT_ExecuteOptions", "num_hlo_output_callbacks"): _IN_LAYOUT_0_114,
    ("PJRT_ExecuteOptions", "custom_options"): _IN_LAYOUT_0_117,
    ("PJRT_ExecuteOptions", "num_custom_options"): _IN_LAYOUT_0_117,
    ("PJRT_Executable_DeserializeAndLoad_Args", "load_options"): _IN_LAYOUT_0_114,
    ("PJRT_Device_MemoryStats_Args", "peak_allocated_bytes"): _IN_LAYOUT_0_117,
    ("PJRT_Device_MemoryStats_Args", "peak_allocated_bytes_is_set"): _IN_LAYOUT_0_117,
}

#: Fields that plugins at or above MIN_SUPPORTED_MINOR may still lack, with the minor that
#: added them; the runtime sets them only when the plugin is new enough.
FIELDS_ADDED: dict[tuple[str, str], int] = {
    ("PJRT_Client_Create_Args", "kv_try_get_callback"): 61,
    ("PJRT_Client_Create_Args", "kv_try_get_user_arg"): 61,
    ("PJRT_ExecuteOptions", "context"): 64,
    ("PJRT_ExecuteOptions", "call_location"): 76,
    ("PJRT_ExecuteOptions", "num_tasks"): 78,
    ("PJRT_Executable_DeserializeAndLoad_Args", "overridden_serialized_compile_options"): 71,
    ("PJRT_Executable_DeserializeAndLoad_Args", "overridden_serialized_compile_options_size"): 71,
    **FIELDS_ADDED_AFTER_0_81,
}

#: Byte offset of the first function slot in PJRT_Api.
SLOT_BASE_OFFSET = 40
#: The pointer size the layout assumes (LP64).
POINTER_SIZE = 8


def _api_struct_cdef() -> str:
    lines = [
        "typedef struct PJRT_Api {",
        "  size_t struct_size;",
        "  PJRT_Extension_Base* extension_start;",
        "  PJRT_Api_Version pjrt_api_version;",
    ]
    for slot in API_SLOTS:
        if slot.args is None:
            lines.append(f"  PJRT_UntypedFunction* {slot.name};")
        elif slot.name in ("PJRT_Error_Destroy", "PJRT_Error_Message"):
            lines.append(f"  void (*{slot.name})({slot.args}* args);")
        else:
            lines.append(f"  PJRT_Error* (*{slot.name})({slot.args}* args);")
    lines.append("} PJRT_Api;")
    lines.append("const PJRT_Api* GetPjrtApi(void);")
    return "\n".join(lines) + "\n"


#: The complete declarations, as C text (cffi reads it; the ABI test also compiles it).
CDEF = _TYPES + _EXTENSION_TYPES + _api_struct_cdef()

#: The compiled fast path's interface (runtime/csrc/fastpath.c, loaded by _fastpath): plans
#: that hold the plugin's functions and the args structs they take, filled once in Python.
#: The build writes this text and CDEF into the C header, so both sides share one layout.
FASTPATH_DECLARATIONS = """
typedef enum {
  PJRTP_DONE = 0,               /* every event (if any) was ready, awaited and destroyed */
  PJRTP_DONE_WITH_ERRORS = 1,   /* the same, and errors[] or destroy_errors[] hold an error */
  PJRTP_EXECUTE_FAILED = 2,     /* pjrtp_execute: execute_error is PJRT_LoadedExecutable_Execute's */
  PJRTP_RUNNING = 3,            /* an event is not ready yet: none was touched */
  PJRTP_READINESS_UNKNOWN = 4   /* errors[0] is PJRT_Event_IsReady's error: none was touched */
} PJRTP_Status;

typedef enum {
  PJRTP_STEP_HOLD = 0,          /* PJRT_Buffer_IncreaseExternalReferenceCount */
  PJRTP_STEP_WHERE = 1,         /* PJRT_Buffer_OpaqueDeviceMemoryDataPointer */
  PJRTP_STEP_UNHOLD = 2         /* PJRT_Buffer_DecreaseExternalReferenceCount */
} PJRTP_ReadStep;

typedef struct PJRTP_EventPlan {
  PJRT_Error* (*is_ready)(PJRT_Event_IsReady_Args* args);
  PJRT_Error* (*await_event)(PJRT_Event_Await_Args* args);
  PJRT_Error* (*destroy_event)(PJRT_Event_Destroy_Args* args);
  PJRT_Event_IsReady_Args* is_ready_args;
  PJRT_Event_Await_Args* await_args;
  PJRT_Event_Destroy_Args* destroy_args;
  PJRT_Error** errors;           /* one per event */
  PJRT_Error** destroy_errors;   /* one per event */
} PJRTP_EventPlan;

typedef struct PJRTP_ExecutePlan {
  PJRT_Error* (*execute)(PJRT_LoadedExecutable_Execute_Args* args);
  PJRT_LoadedExecutable_Execute_Args* execute_args;
  PJRTP_EventPlan* events;       /* finishes the device-complete events, one per device */
  PJRT_Error* execute_error;     /* after PJRTP_EXECUTE_FAILED */
  int64_t* launch_ids;           /* the executable's counter: each execute takes the next, mod 2^31 */
} PJRTP_ExecutePlan;

typedef struct PJRTP_ReadPlan {
  PJRT_Error* (*hold)(PJRT_Buffer_IncreaseExternalReferenceCount_Args* args);
  PJRT_Error* (*where)(PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args* args);
  PJRT_Error* (*unhold)(PJRT_Buffer_DecreaseExternalReferenceCount_Args* args);
  PJRT_Buffer_IncreaseExternalReferenceCount_Args* hold_args;
  PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args* where_args;
  PJRT_Buffer_DecreaseExternalReferenceCount_Args* unhold_args;
  int failed_step;               /* a PJRTP_ReadStep, when pjrtp_read_pinned returns an error */
  PJRT_Error* unhold_error;      /* after a failed PJRTP_STEP_WHERE: the unhold's own error */
} PJRTP_ReadPlan;

typedef struct PJRTP_DestroyPlan {
  PJRT_Error* (*destroy)(PJRT_Buffer_Destroy_Args* args);
  PJRT_Buffer_Destroy_Args* destroy_args;
} PJRTP_DestroyPlan;

int pjrtp_finish_ready(PJRTP_EventPlan* plan, PJRT_Event** events, size_t count);
int pjrtp_execute(PJRTP_ExecutePlan* plan);
PJRT_Error* pjrtp_read_pinned(PJRTP_ReadPlan* plan, PJRT_Buffer* buffer, char* dst, size_t nbytes);
int pjrtp_destroy_buffers(PJRTP_DestroyPlan* plan, PJRT_Buffer** buffers, size_t count, PJRT_Error** errors);
unsigned long pjrtp_declarations_crc(void);
"""

#: Compiled into the library (pjrtp_declarations_crc): a library built from other
#: declarations than this module's is never called.
FASTPATH_CRC = zlib.crc32((CDEF + FASTPATH_DECLARATIONS).encode())

ffi = cffi.FFI()
ffi.cdef(CDEF)
ffi.cdef(FASTPATH_DECLARATIONS)


def field_end(struct: str, field: str) -> int:
    """``offsetof(struct, field) + sizeof(field)``: the bytes a struct needs to hold ``field``."""
    item = dict(POINTER_CTYPES[struct].item.fields)[field]
    return item.offset + ffi.sizeof(item.type)


def _pointer_ctypes() -> dict[str, Any]:
    """``{type name: the ctype of a pointer to it}`` for every declared typedef, from one parse.

    cffi parses each type string anew with every declared typedef in front: one ``ffi.typeof``
    per name took about 5 ms, 0.6 s for all of them at import. Here they are the parameters of
    one function type instead.
    """
    names = ffi.list_types()[0]
    signature = ffi.typeof("void(*)(" + ", ".join(f"{name}*" for name in names) + ")")
    return dict(zip(names, signature.args, strict=True))  # a function pointer ctype: its parameters


#: ``ffi.typeof(name + "*")`` of every declared type, resolved once at import (see new_args).
POINTER_CTYPES: dict[str, Any] = _pointer_ctypes()


def declared_structs() -> Iterator[tuple[str, Any]]:
    """``(name, ctype)`` for every struct with fields that the cdef declares."""
    for name, pointer in POINTER_CTYPES.items():
        if pointer.kind != "pointer":  # a function typedef: its pointer is a function pointer
            continue
        ctype = pointer.item
        if ctype.kind == "struct" and ctype.fields and not name.startswith("PJRTP_"):  # not the fast path's
            yield name, ctype


def _struct_sizes() -> dict[str, int]:
    """The end of the last field (the header's STRUCT_SIZE) for every struct we declare."""
    return {name: field_end(name, ctype.fields[-1][0]) for name, ctype in declared_structs()}


STRUCT_SIZE: dict[str, int] = _struct_sizes()

#: Slot index and metadata by function name.
SLOT_INDEX: dict[str, int] = {slot.name: i for i, slot in enumerate(API_SLOTS)}
SLOTS_BY_NAME: dict[str, Slot] = {slot.name: slot for slot in API_SLOTS}


def slot_end(name: str) -> int:
    """Bytes of PJRT_Api a plugin must report for slot ``name`` to exist."""
    return SLOT_BASE_OFFSET + POINTER_SIZE * (SLOT_INDEX[name] + 1)


def enum_values(type_name: str) -> dict[str, int]:
    """``{member name: value}`` of a declared enum (cffi refuses names as values)."""
    return dict(POINTER_CTYPES[type_name].item.relements)


EXTENSION_TYPE_NAMES: dict[int, str] = {
    value: name.removeprefix("PJRT_Extension_Type_") for name, value in enum_values("PJRT_Extension_Type").items()
}
