
example

remote_address10.0.0.1