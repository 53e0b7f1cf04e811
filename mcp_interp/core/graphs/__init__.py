"""Attribution graphs (circuit tracing): transcoders' features, the local replacement model, pruning, export."""
