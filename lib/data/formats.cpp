// Format detection for the other producers' dumps (formats.h): each format is recognised by what
// its producer always writes, and a directory that looks like two formats at once is refused
// rather than guessed.
#include "data/formats.h"

#include <filesystem>
#include <vector>

#include "core/error.h"

namespace fsdp::data {

std::shared_ptr<FeatureDataset> open_producer_dataset(const std::string& path,
                                                      const DatasetOptions& options) {
  if (!std::filesystem::is_directory(path)) return nullptr;
  std::vector<std::string> found;
  if (is_deepspec_cache(path)) found.push_back("deepspec");
  if (is_speculators_dump(path)) found.push_back("speculators");
  if (is_modelopt_dump(path)) found.push_back("modelopt");
  if (found.empty()) return nullptr;
  FSDP_USAGE_CHECK(
      found.size() == 1,
      str(path, ": holds files of several feature formats (", found[0], " and ", found[1], ")"),
      "keep each producer's dump in its own directory and point the path at one");
  if (found[0] == "deepspec") return open_deepspec_dataset(path, options);
  if (found[0] == "speculators") return open_speculators_dataset(path, options);
  return open_modelopt_dataset(path, options);
}

}  // namespace fsdp::data
