"""The framework-free core: layout (path arithmetic), the file-system seam (fs), CRC32
(checksum), the ``ckpt-info.json`` schema (sidecar), pure policies (policy) and the
operations log (log). Imports nothing from the other layers, and no keras.
"""
