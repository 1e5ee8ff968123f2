"""The config's sections, one module per owner (`run`, `model`, `data`, `rollout`, `reward`, `algorithm`,
`trainer`, `preference`, `cluster`); `hone.config.schema` assembles them into `HoneConfig`, and
`hone.config` exports every section's class."""
