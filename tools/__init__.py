"""The lab beside the library: plain scripts that import fedjax_pfl and are imported by none of its modules."""
