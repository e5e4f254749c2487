"""What the tests share: Bernard's stack for a test, the session's Redis, scripted
upstreams and servers, real processes and terminals, and readers of what Bernard sends."""
