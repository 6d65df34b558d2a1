/* The client's topology description of the stub_neuron plugin.
 *
 * XLA's C++ client (PjRtCApiClient: JAX, torch_xla) asks every plugin for its
 * topology in its constructor, without checking the slot, and reads its
 * platform name, version and attributes; torch_xla also serializes it. A
 * plugin that leaves these slots NULL crashes both frameworks at client creation.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stub_neuron.h"

PJRT_Error* stub_topology_init(PJRT_Client* client) {
  PJRT_TopologyDescription* topology = &client->topology;
  topology->descriptions = calloc(client->num_devices > 0 ? client->num_devices : 1, sizeof(PJRT_DeviceDescription*));
  if (topology->descriptions == NULL) {
    return stub_error(PJRT_Error_Code_RESOURCE_EXHAUSTED, "stub_neuron: out of memory for the topology");
  }
  for (size_t i = 0; i < client->num_devices; ++i) topology->descriptions[i] = &client->devices[i].description;
  static const char* names[STUB_NUM_TOPOLOGY_ATTRIBUTES] = {"num_nodes", "num_devices"};
  const int64_t values[STUB_NUM_TOPOLOGY_ATTRIBUTES] = {client->num_nodes, (int64_t)client->num_devices};
  for (int i = 0; i < STUB_NUM_TOPOLOGY_ATTRIBUTES; ++i) {
    topology->attributes[i] = (PJRT_NamedValue){
        .struct_size = PJRT_NamedValue_STRUCT_SIZE,
        .name = names[i],
        .name_size = strlen(names[i]),
        .type = PJRT_NamedValue_kInt64,
        .int64_value = values[i],
        .value_size = 1,
    };
  }
  snprintf(topology->serialized, sizeof(topology->serialized), "stub_neuron topology v1 num_nodes=%d num_devices=%zu",
           client->num_nodes, client->num_devices);
  topology->client = client;
  topology->magic = STUB_MAGIC_TOPOLOGY;
  return NULL;
}

void stub_topology_free(PJRT_TopologyDescription* topology) {
  topology->magic = STUB_MAGIC_DEAD;
  free(topology->descriptions);
  topology->descriptions = NULL;
}

PJRT_Error* StubClient_TopologyDescription(PJRT_Client_TopologyDescription_Args* args) {
  STUB_CHECK_ARGS(args, PJRT_Client_TopologyDescription_Args);
  args->topology = NULL;
  PJRT_Error* error = stub_check_client(args->client, "PJRT_Client_TopologyDescription");
  if (error != NULL) return error;
  args->topology = &args->client->topology;
  return NULL;
}

#define STUB_CHECK_TOPOLOGY(args, sname) \
  STUB_CHECK_ARGS_OBJECT(args, sname, topology, STUB_MAGIC_TOPOLOGY, "topology description")

PJRT_Error* StubTopologyDescription_Destroy(PJRT_TopologyDescription_Destroy_Args* args) {
  STUB_CHECK_TOPOLOGY(args, PJRT_TopologyDescription_Destroy);
  /* The only topologies are those of clients (no PJRT_TopologyDescription_Create). */
  return stub_error(PJRT_Error_Code_INVALID_ARGUMENT,
                    "PJRT_TopologyDescription_Destroy: this topology belongs to its client and lives as long as "
                    "the client; destroy the client instead");
}

PJRT_Error* StubTopologyDescription_PlatformName(PJRT_TopologyDescription_PlatformName_Args* args) {
  STUB_CHECK_TOPOLOGY(args, PJRT_TopologyDescription_PlatformName);
  args->platform_name = STUB_PLATFORM_NAME;
  args->platform_name_size = sizeof(STUB_PLATFORM_NAME) - 1;
  return NULL;
}

PJRT_Error* StubTopologyDescription_PlatformVersion(PJRT_TopologyDescription_PlatformVersion_Args* args) {
  STUB_CHECK_TOPOLOGY(args, PJRT_TopologyDescription_PlatformVersion);
  args->platform_version = args->topology->client->platform_version;
  args->platform_version_size = strlen(args->topology->client->platform_version);
  return NULL;
}

PJRT_Error* StubTopologyDescription_GetDeviceDescriptions(PJRT_TopologyDescription_GetDeviceDescriptions_Args* args) {
  STUB_CHECK_TOPOLOGY(args, PJRT_TopologyDescription_GetDeviceDescriptions);
  args->descriptions = args->topology->descriptions;
  args->num_descriptions = args->topology->client->num_devices;
  return NULL;
}

static void free_serialized(PJRT_SerializedTopology* serialized) { free(serialized); }

PJRT_Error* StubTopologyDescription_Serialize(PJRT_TopologyDescription_Serialize_Args* args) {
  STUB_CHECK_TOPOLOGY(args, PJRT_TopologyDescription_Serialize);
  /* The bytes must outlive the topology until the deleter runs: hand out a copy. */
  size_t size = strlen(args->topology->serialized);
  char* copy = malloc(size + 1);
  if (copy == NULL) return stub_error(PJRT_Error_Code_RESOURCE_EXHAUSTED, "stub_neuron: out of memory");
  memcpy(copy, args->topology->serialized, size + 1);
  args->serialized_bytes = copy;
  args->serialized_bytes_size = size;
  args->serialized_topology = (PJRT_SerializedTopology*)copy;
  args->serialized_topology_deleter = free_serialized;
  return NULL;
}

PJRT_Error* StubTopologyDescription_Attributes(PJRT_TopologyDescription_Attributes_Args* args) {
  STUB_CHECK_TOPOLOGY(args, PJRT_TopologyDescription_Attributes);
  args->attributes = args->topology->attributes;
  args->num_attributes = STUB_NUM_TOPOLOGY_ATTRIBUTES;
  return NULL;
}
