"""What an analysis writes besides the members: copies of the prior (copies), mean and
spread (products, shuffleproducts), CF metadata (cf). The top room."""
