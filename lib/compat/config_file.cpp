// Which kind of --config file a text is, and the reader it goes to (config_file.h).
#include "compat/config_file.h"

#include "compat/specforge_schema.h"
#include "core/error.h"

namespace fsdp::config {

ConfigFileLoad load_config_text(const std::string& text, const std::string& source_name,
                                const std::vector<std::string>& overrides, TrainConfig* cfg,
                                int world_size) {
  ConfigFileLoad out;
  if (detail::is_specforge_schema_text(text)) {
    SchemaLoad sl = detail::apply_specforge_schema(text, source_name, overrides, world_size, cfg);
    out.set_options = std::move(sl.set_options);
    out.report.push_back(str(source_name,
                             ": SpecForge's typed schema (specforge train -c): "
                             "SpecForge's defaults and semantics apply "
                             "(docs/migration-from-specforge.md)"));
    for (auto& line : sl.report) out.report.push_back("  " + line);
    out.specforge_schema = true;
    return out;
  }
  FSDP_USAGE_CHECK(overrides.empty(),
                   str("'", overrides.empty() ? "" : overrides.front(),
                       "': section.key=value "
                       "overrides need a --config file in SpecForge's typed schema, and ",
                       source_name, " is an fsdp-train run file"),
                   "override its keys with flags instead (--learning-rate 5e-5)");
  out.set_options = apply_yaml_text(text, source_name, cfg);
  return out;
}

ConfigFileLoad load_config_file(const std::string& path, const std::vector<std::string>& overrides,
                                TrainConfig* cfg, int world_size) {
  return load_config_text(read_config_file(path), path, overrides, cfg, world_size);
}

}  // namespace fsdp::config
