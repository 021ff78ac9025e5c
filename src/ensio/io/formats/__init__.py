"""Member-file formats: the `MemberStore` contract (store), one module per format
(netcdf4, classic), the raw byte-range path (raw), the netCDF-library path (library),
opening by content (open). Imports no other room."""
