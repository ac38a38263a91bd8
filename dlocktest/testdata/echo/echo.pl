# Answers each connection's first line with that line, then closes it.
use IO::Socket::INET;
my $s = IO::Socket::INET->new(LocalPort => 7000, Listen => 16, ReuseAddr => 1) or die "listen: $!";
while (my $c = $s->accept) {
	my $line = <$c>;
	print $c $line if defined $line;
	close $c;
}
