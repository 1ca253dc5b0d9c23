"""Viking Engine's Python side: thin node classes over the native module `viking_native`."""
